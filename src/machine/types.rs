//! The run machine's vocabulary: what goes in (journaled inputs), what comes out (actions), and
//! what a run ends with (the result).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::AgentConfig;
use crate::protocol::{Actor, Call, CallId, Decision, Event, Message, Millis, Tool};
use crate::scheduler::{CallStatus, Outcome};

/// Which agent of the run something concerns: `None` for the run's own agent, `Some(call)` for
/// the nested agent (delegate) that call runs.
pub type FrameKey = Option<CallId>;

/// A timer the machine set. The machine keeps its timers ([`super::RunMachine::poll_timeout`]); no
/// action announces one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "timer", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Timer {
    /// The reviewer of this call ran out of time (the policy's default applies).
    Approval {
        /// The call.
        call: CallId,
    },
    /// An agent's run timeout (`limits.timeout_s`).
    Deadline {
        /// The agent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        frame: FrameKey,
    },
}

/// Everything the machine consumes, in the order it consumed it. Each input is journaled before
/// the machine handles it; replaying the journal through a fresh machine gives the same events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "input", rename_all = "snake_case")]
#[non_exhaustive]
pub enum RunInput {
    /// The run begins.
    Start,
    /// The model streamed a call.
    Call {
        /// The agent whose model it is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        frame: FrameKey,
        /// The call as written (when its schema was sent strict, without the `null`s strict
        /// mode made the model write for params it left out: `llm::drop_strict_nulls`). Shared
        /// with the scheduler and the `call_received` event, never copied.
        call: Arc<Call>,
        /// Its references and output target, parsed by the turn reader with the call (beside
        /// the driver for a long answer); never journaled: a replayed call is parsed when the
        /// machine takes it.
        #[serde(skip)]
        parsed: crate::scheduler::Parsed,
    },
    /// The model streamed something that is not a valid call (it is refused; the model is told).
    Unreadable {
        /// The agent whose model it is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        frame: FrameKey,
        /// The raw text of the element.
        raw: String,
        /// Why it could not be read.
        reason: String,
    },
    /// The turn's `output` value.
    Output {
        /// The agent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        frame: FrameKey,
        /// The value as written (references not yet resolved; strict mode's `null`s dropped as
        /// for calls).
        output: Value,
    },
    /// The response as a whole was not a Solution (no JSON, not an object, malformed or
    /// truncated JSON, fields a Solution does not have, nothing at all).
    Problem {
        /// The agent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        frame: FrameKey,
        /// What was wrong and what was received, in words meant for the model
        /// (`context::correction::Problem::message`).
        problem: String,
        /// Its stable code (`plan.no_solution`, `plan.unknown_fields`...); absent in journals
        /// of older versions, whose `problem` is shown as it is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<String>,
    },
    /// The model's `thoughts` for the turn, as it wrote them (journaled so that a reader of
    /// the run, the reviewer's page, shows them beside the calls; they change nothing).
    Thoughts {
        /// The agent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        frame: FrameKey,
        /// The thoughts (a string, usually; any JSON value the model wrote).
        thoughts: Value,
    },
    /// The workspace memory chunks the engine found for an agent's next step (answering
    /// [`Action::Recall`]): journaled, so the step's context is rebuilt without the folder.
    Recalled {
        /// The agent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        frame: FrameKey,
        /// The step they are for.
        step: u32,
        /// The chunks, best first (empty: none matched, or no index to search).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        chunks: Vec<crate::context::memory::Chunk>,
        /// Why no search was made (the folder could not be read again, or the worker could
        /// not search it): the step recalls nothing, and the journal says why.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
    /// Tokens reported by the provider (or estimated when it reports none).
    Usage {
        /// The agent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        frame: FrameKey,
        /// Prompt tokens.
        input_tokens: u64,
        /// Completion tokens.
        output_tokens: u64,
        /// The provider reported nothing; these are estimated from the text (about four
        /// characters a token).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        estimated: bool,
        /// Prompt tokens read from the provider's prompt cache (not in `input_tokens`).
        #[serde(default, skip_serializing_if = "is_zero")]
        cache_read_tokens: u64,
        /// Prompt tokens written to the provider's prompt cache (not in `input_tokens`).
        #[serde(default, skip_serializing_if = "is_zero")]
        cache_write_tokens: u64,
        /// The display name of the model that answered the turn (`openai:gpt-4o-mini`);
        /// absent in journals of older versions.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
    },
    /// The model answering the turn failed after its retries with an error another provider
    /// could fix: the same request goes to the next model of the agent's list. Journaled, so
    /// that a turn asked again after a restart goes to the model that was answering it.
    Fallback {
        /// The agent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        frame: FrameKey,
        /// The display name of the model that failed.
        from: String,
        /// The display name of the model asked now.
        to: String,
        /// The position of `to` in the agent's model list (from 0).
        index: usize,
        /// The stable code of the error (`llm.http_status`, `llm.transport`...).
        code: String,
        /// The error, in words.
        error: String,
    },
    /// The model's stream broke after its content had started: the same request is asked once
    /// more of the same model without streaming (the calls already taken are not taken twice).
    /// Journaled, so that a replay says so and a turn asked again after a restart is asked the
    /// same way.
    Reask {
        /// The agent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        frame: FrameKey,
        /// The display name of the model asked again.
        model: String,
        /// The stable code of the error that broke the stream (`llm.transport`...).
        code: String,
        /// The error, in words.
        error: String,
    },
    /// An attempt at the model failed and is retried.
    Retry {
        /// The agent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        frame: FrameKey,
        /// The attempt that failed (from 1).
        attempt: u32,
        /// The provider's HTTP status, when there was one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<u16>,
        /// The wait before the next attempt.
        wait_ms: u64,
        /// Why it failed.
        error: String,
    },
    /// The model's stream for the current turn ended (with the error that ended it, if any).
    StreamClosed {
        /// The agent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        frame: FrameKey,
        /// A model failure that ends the run (after retries).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<Box<RunError>>,
        /// Why the model stopped, as the provider said (`stop`, `length`, `tool_calls`,
        /// `content_filter` or its own word); None when the stream ended without saying, or
        /// failed. Journals written before it was recorded have none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        finish_reason: Option<String>,
    },
    /// An activity ended.
    Outcome {
        /// The call.
        call: CallId,
        /// How it ended, with the branch it chose.
        outcome: Outcome,
    },
    /// A reviewer's decision was accepted.
    Decided {
        /// The call.
        call: CallId,
        /// The decision.
        decision: Decision,
        /// Who decided (journals written before this was recorded have none).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
        /// The presentation it answered (the `seq` of the call's `approval_requested` event;
        /// journals written before this was recorded have none). A decision for a
        /// presentation that is not the call's current one changes nothing.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        presentation: Option<u64>,
    },
    /// A call awaiting a decision was shown to somebody (prompted at a terminal, listed to
    /// the page or the API): its reviewer timeout starts now, once per presentation.
    Shown {
        /// The call.
        call: CallId,
        /// The presentation shown (the `seq` of its `approval_requested` event).
        presentation: u64,
    },
    /// A decision taken from the store's queue no longer applied (its presentation was decided
    /// otherwise or presented again): journaled so that it leaves the queue and shows in the
    /// audit; it changes nothing else.
    Dropped {
        /// The call.
        call: CallId,
        /// The decision.
        decision: Decision,
        /// Who decided.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
        /// The presentation it answered.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        presentation: Option<u64>,
        /// Why it no longer applied (the op refusal's code).
        code: String,
    },
    /// A reviewer's standing approval was accepted (it approves covered calls as they are
    /// presented). Older journals call it `grant`, its field `grant`.
    #[serde(alias = "grant")]
    Allow {
        /// What it covers.
        #[serde(alias = "grant")]
        standing: crate::protocol::StandingSpec,
        /// Who gave it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    /// A standing approval was revoked.
    Revoke {
        /// Its id (`grant` in older journals).
        #[serde(alias = "grant")]
        standing: String,
        /// Who revoked.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    /// A timer the machine set came due ([`super::RunMachine::timers_by_due`]).
    TimerFired {
        /// Which.
        timer: Timer,
    },
    /// The run was cancelled.
    Cancel {
        /// Why.
        reason: String,
        /// Who cancelled (journals written before this was recorded have none).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    /// The run was rebuilt from its journal after its process stopped: model turns that were
    /// streaming are asked again (the calls they had already streamed are not taken twice),
    /// and calls that had started are interrupted (re-run when idempotent, else re-presented).
    Resumed,
    /// One started call's activity was lost (the worker running it stopped) without an
    /// outcome: like a call interrupted by a restart, it is re-run when its tool is idempotent
    /// and presented to a reviewer again otherwise. Used by engines whose activities can
    /// outlive the process that drives the run (Temporal workers).
    Interrupted {
        /// The call.
        call: CallId,
    },
}

impl RunInput {
    /// This input for the machine, leaving the journal's copy without what was parsed ahead
    /// (a call's [`crate::scheduler::Parsed`], which only the machine reads): one copy of it,
    /// moved rather than shared, so the scheduler takes it without copying it.
    pub(crate) fn split_for_machine(&mut self) -> RunInput {
        let parsed = match self {
            RunInput::Call { parsed, .. } => std::mem::take(parsed),
            _ => return self.clone(),
        };
        let mut input = self.clone();
        if let RunInput::Call { parsed: p, .. } = &mut input {
            *p = parsed;
        }
        input
    }

    /// The input's tag, as journaled.
    pub fn name(&self) -> &'static str {
        match self {
            RunInput::Start => "start",
            RunInput::Call { .. } => "call",
            RunInput::Unreadable { .. } => "unreadable",
            RunInput::Output { .. } => "output",
            RunInput::Problem { .. } => "problem",
            RunInput::Usage { .. } => "usage",
            RunInput::Thoughts { .. } => "thoughts",
            RunInput::Recalled { .. } => "recalled",
            RunInput::Retry { .. } => "retry",
            RunInput::Fallback { .. } => "fallback",
            RunInput::Reask { .. } => "reask",
            RunInput::StreamClosed { .. } => "stream_closed",
            RunInput::Outcome { .. } => "outcome",
            RunInput::Decided { .. } => "decided",
            RunInput::Dropped { .. } => "dropped",
            RunInput::Shown { .. } => "shown",
            RunInput::Allow { .. } => "allow",
            RunInput::Revoke { .. } => "revoke",
            RunInput::TimerFired { .. } => "timer_fired",
            RunInput::Cancel { .. } => "cancel",
            RunInput::Resumed => "resumed",
            RunInput::Interrupted { .. } => "interrupted",
        }
    }
}

impl RunInput {
    /// The input an accepted op becomes (the one conversion every driver uses).
    pub fn from_op(op: crate::protocol::Op) -> RunInput {
        use crate::protocol::Op;
        match op {
            Op::Decide {
                call,
                decision,
                by,
                presentation,
                ..
            } => RunInput::Decided {
                call,
                decision,
                by,
                presentation,
            },
            Op::Allow { standing, by } => RunInput::Allow { standing, by },
            Op::Revoke { standing, by } => RunInput::Revoke { standing, by },
            Op::Cancel { reason, by } => RunInput::Cancel { reason, by },
            Op::Shown { call, presentation } => RunInput::Shown { call, presentation },
        }
    }
}

/// One journal entry: an input with its position and the time it was consumed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// Position in the run's journal, from 1 without gaps.
    pub seq: u64,
    /// When the machine consumed it (milliseconds since the Unix epoch, the engine's clock).
    pub at: Millis,
    /// What it consumed.
    #[serde(flatten)]
    pub input: RunInput,
}

/// What the engine must do.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Action {
    /// Start a model turn for an agent; feed back [`RunInput::Call`]s, `Output`, `Usage`,
    /// `Problem`, `Retry` and finally `StreamClosed` for this frame.
    Request {
        /// The agent.
        frame: FrameKey,
        /// The step (Request number) of that agent.
        step: u32,
        /// The context.
        messages: Vec<Message>,
        /// The agent's configuration (its composed schema, tools and model).
        config: Arc<AgentConfig>,
        /// How many calls at the start of the stream were already taken (a turn asked again
        /// after a restart): the engine drops that many before feeding calls back.
        skip_calls: usize,
        /// The position, in the agent's model list, of the model to ask first: 0 for a new
        /// turn, the model a journaled [`RunInput::Fallback`] moved to for a turn asked again.
        model: usize,
        /// Ask that model without streaming: a turn asked again after a restart that a
        /// journaled [`RunInput::Reask`] had moved to a whole (non-streamed) request.
        whole: bool,
    },
    /// Search the run's workspace memory for an agent's next step (its goal and what the last
    /// step brought: [`crate::context::memory::step_query`]); feed back [`RunInput::Recalled`]
    /// for this frame and step, whose chunks the step's context shows.
    Recall {
        /// The agent.
        frame: FrameKey,
        /// The step about to be asked.
        step: u32,
        /// What to search for.
        query: String,
    },
    /// Stop reading an agent's model stream (the agent was cancelled or timed out).
    CloseStream {
        /// The agent.
        frame: FrameKey,
    },
    /// Run a call's activity; feed back [`RunInput::Outcome`] unless `detached`.
    Launch {
        /// The call.
        id: CallId,
        /// The call with its references resolved, shared with its `started` event.
        call: Arc<Call>,
        /// Its tool.
        tool: Arc<Tool>,
        /// Fire-and-forget: nobody waits for its outcome.
        detached: bool,
        /// The per-call time limit of the agent that made the call.
        timeout_ms: Option<u64>,
    },
    /// Stop a running activity; its outcome is no longer wanted.
    Abort {
        /// The call.
        id: CallId,
    },
    /// Publish an event (already numbered and stamped).
    Emit(Event),
    /// The run is over; nothing more will be asked.
    Finished(Box<RunResult>),
}

/// How a run ended.
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
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
    /// The provider kept saying the context does not fit the model's window, even at the most
    /// compacted level.
    ContextOverflow,
    /// The run could not be set up: what it was defined with does not make a machine (a goal
    /// that does not load, a schema that does not compile, a record this version cannot read).
    /// The machine decided nothing and no model was asked; the error's `cause` says what failed.
    SetupFailed,
    /// Not an ending: the run's journal could not be written (or this process lost the run's
    /// lease), so the run stopped rather than go on unrecorded. Its journal is intact and it
    /// can be resumed; no result is recorded for it. The error says why (`store.journal_write`,
    /// `store.lease_lost`).
    Stopped,
}

impl RunStatus {
    /// Every way a run ends, in one place: what a run can be listed by
    /// ([`crate::store::STATUSES`] is built from it). [`RunStatus::Stopped`] is not an ending.
    pub const ENDINGS: [RunStatus; 11] = [
        RunStatus::Succeeded,
        RunStatus::MaxSteps,
        RunStatus::DoomLoop,
        RunStatus::EmptyTurns,
        RunStatus::TokenBudget,
        RunStatus::Timeout,
        RunStatus::Cancelled,
        RunStatus::InvalidOutput,
        RunStatus::ModelError,
        RunStatus::ContextOverflow,
        RunStatus::SetupFailed,
    ];

    /// The status as written in results and events.
    pub const fn as_str(self) -> &'static str {
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
            RunStatus::ContextOverflow => "context_overflow",
            RunStatus::SetupFailed => "setup_failed",
            RunStatus::Stopped => "stopped",
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
            RunStatus::ContextOverflow => Some("run.context_overflow"),
            RunStatus::SetupFailed => Some("run.setup_failed"),
            RunStatus::Stopped => Some("run.stopped"),
        }
    }

    /// True for every way the machine ends a run; false for [`RunStatus::Stopped`], which
    /// leaves the run to be resumed.
    pub fn is_final(self) -> bool {
        self != RunStatus::Stopped
    }
}

/// Why a run did not succeed: a stable code, a message, and what caused it.
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunError {
    /// Stable code (`run.max_steps`, `run.model_error`, ...).
    pub code: String,
    /// What happened, in words.
    pub message: String,
    /// The underlying error (a provider's code and message, a journal failure...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Value>,
    /// Validation errors (for `run.invalid_output`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

impl RunError {
    /// An error with a code and a message.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        RunError {
            code: code.into(),
            message: message.into(),
            cause: None,
            errors: Vec::new(),
        }
    }

    /// The error as a JSON object (what a parent agent's delegate call fails with).
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// Tokens used over the run.
///
/// Prompt-cache tokens (Anthropic's `cache_read_input_tokens` and
/// `cache_creation_input_tokens`) are reported apart from `input_tokens`, as the provider
/// reports them, and left out of the JSON when zero.
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens (prompt-cache reads and writes not included).
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Prompt tokens read from the provider's prompt cache.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's prompt cache.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_tokens: u64,
    /// Some of the figures are estimates (a server that reported no usage).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
    /// The same figures for each model that answered, by its display name (`openai:gpt-4o`).
    /// In a run's result, present only when more than one model answered (fallback models, a
    /// delegate with a model of its own); left out of the JSON when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "server", schema(no_recursion))]
    pub models: BTreeMap<String, Usage>,
}

impl Usage {
    /// Every token the model read or wrote: input, output, and prompt-cache reads and writes
    /// (what `token_budget` is held against).
    pub fn total(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.output_tokens)
            .saturating_add(self.cache_read_tokens)
            .saturating_add(self.cache_write_tokens)
    }

    pub(super) fn add(&mut self, other: Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cache_read_tokens = self
            .cache_read_tokens
            .saturating_add(other.cache_read_tokens);
        self.cache_write_tokens = self
            .cache_write_tokens
            .saturating_add(other.cache_write_tokens);
        self.estimated |= other.estimated;
        for (model, u) in other.models {
            self.models.entry(model).or_default().add(u);
        }
    }

    /// These figures, also counted for `model` when it is named.
    pub(super) fn of_model(self, model: Option<String>) -> Usage {
        let Some(model) = model else {
            return self;
        };
        let mut total = self.clone();
        total.models.insert(model, self);
        total
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One call of the run, summarised.
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallSummary {
    /// The call's id.
    pub id: CallId,
    /// The step it belonged to (0 = the goal's initial plan).
    pub step: u32,
    /// Its tool (after a reviewer's replacement, the replacing tool).
    pub tool: String,
    /// What became of it.
    pub status: CallStatus,
    /// The reviewer's decision, when one was taken (`approve`, `edit`, `replace`, `reject`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<String>,
    /// The error object, for anything but done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
}

/// The result of a run: what `dagloop run` prints and `Agent::run` returns.
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
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
    /// Tokens used (nested agents included).
    pub usage: Usage,
    /// Every call of the run's own agent.
    pub calls: Vec<CallSummary>,
    /// For a failed run: a stable code, a message and details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
}

impl RunResult {
    /// How many of the run's calls are in `status`.
    pub fn count(&self, status: CallStatus) -> usize {
        self.calls.iter().filter(|c| c.status == status).count()
    }

    /// A run that stopped without ending. Every ending is the machine's; a driver's only
    /// outcome of its own is this: its journal could not be written, its lease was lost,
    /// nothing in this process could move the run on, or the driver itself died. The machine
    /// decided nothing, so nothing is recorded as the run's result and it can be resumed
    /// ([`RunStatus::Stopped`], not final).
    pub fn stopped(error: RunError) -> RunResult {
        RunResult {
            status: RunStatus::Stopped,
            output: serde_json::Value::Null,
            state: serde_json::Value::Null,
            steps: 0,
            usage: Usage::default(),
            calls: Vec::new(),
            error: Some(error),
        }
    }

    /// The ending of a run whose machine could not be built from its definition
    /// ([`RunStatus::SetupFailed`]): final, with nothing run and no model asked. `cause` is the
    /// failure (its code and message become the error's `cause`), so a reader tells a goal that
    /// does not load from a model that failed.
    pub fn setup_failed(cause: &RunError) -> RunResult {
        let mut error = RunError::new(
            "run.setup_failed",
            format!("the run could not be set up: {}", cause.message),
        );
        error.cause = Some(serde_json::json!({"code": cause.code, "message": cause.message}));
        RunResult {
            status: RunStatus::SetupFailed,
            ..RunResult::stopped(error)
        }
    }

    /// True when the run produced a valid output.
    pub fn succeeded(&self) -> bool {
        self.status == RunStatus::Succeeded
    }
}
