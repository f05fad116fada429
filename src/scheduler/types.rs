//! The scheduler's vocabulary: inputs, actions, outcomes, the step report and errors.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::graph::GraphError;
use crate::protocol::{
    Call, CallId, Decision, EventKind, ProtocolError, ReferenceError, Tool, error_object,
};
use crate::schema::{SchemaError, Violation};
use crate::state::StateError;

/// Something that happened outside the scheduler.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Input {
    /// The model's stream produced a call, or something the parser could not read as one
    /// (the error text goes back to the model). The caller allocates the id (unique across the
    /// run, so nested agents never reuse one).
    CallArrived {
        /// The id the call gets.
        id: CallId,
        /// The call (shared with the journal and the `call_received` event), or why it could
        /// not be read.
        call: Result<Arc<Call>, UnreadableCall>,
        /// Its references and output target, when they were parsed ahead ([`Parsed::of`]);
        /// [`Parsed::default`] has the scheduler parse them.
        parsed: Parsed,
    },
    /// The model's stream ended: no more calls this step.
    StreamClosed,
    /// A reviewer answered about a call presented with [`Action::Ask`].
    Decided {
        /// The call.
        id: CallId,
        /// The answer.
        decision: Decision,
    },
    /// The reviewer did not answer within the policy's timeout.
    ApprovalTimedOut {
        /// The call.
        id: CallId,
    },
    /// A launched activity ended.
    Finished {
        /// The call.
        id: CallId,
        /// How it ended.
        outcome: Outcome,
    },
    /// Stop: launch nothing more, abort running calls, report everything unfinished cancelled.
    Cancel,
    /// The run was rebuilt after a stop while this call's activity ran (see
    /// `Scheduler::interrupted` for what happens).
    Interrupted {
        /// The call.
        id: CallId,
    },
    /// Go on checking the calls that wait to be, after an eager stop
    /// ([`super::Scheduler::set_eager`]). Nothing else.
    Settle,
}

/// Something the driver must do.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Action {
    /// Present a call to a reviewer; answer with [`Input::Decided`] (or
    /// [`Input::ApprovalTimedOut`] once `timeout` elapses).
    Ask {
        /// The call.
        id: CallId,
        /// The call with its references resolved, shared with its `approval_requested` event.
        call: Arc<Call>,
        /// Its tool.
        tool: Arc<Tool>,
        /// The policy's reviewer timeout.
        timeout: Option<Duration>,
        /// It was interrupted by a restart (no standing approval covers it).
        interrupted: bool,
    },
    /// Run a call's activity now; answer with [`Input::Finished`] unless `detached`.
    Launch {
        /// The call.
        id: CallId,
        /// The call with its references resolved, shared with its `started` event.
        call: Arc<Call>,
        /// Its tool.
        tool: Arc<Tool>,
        /// Fire-and-forget (rule 11): the loop does not wait for it and ignores its outcome.
        detached: bool,
    },
    /// Stop a running activity (cancellation); its outcome is no longer awaited.
    Abort {
        /// The call.
        id: CallId,
    },
    /// Publish an event (the run's machine stamps it with a sequence number and time).
    Event {
        /// The call it concerns.
        call: Option<CallId>,
        /// What happened.
        kind: EventKind,
    },
    /// The step is over: nothing is waiting, asking or running, and the stream is closed (or the
    /// step was cancelled). Emitted once.
    Drained,
}

/// How an activity ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OutcomeKind {
    /// It returned a result.
    Ok,
    /// It returned an error.
    Error,
    /// It ran past the call timeout.
    Timeout,
    /// It panicked.
    Panic,
    /// It was cancelled.
    Cancelled,
}

/// What an activity produced.
///
/// The value is shared, not copied, by everything that keeps it: the journal's input, the
/// state's writes, the `finished` (or `failed`) event and the step's report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// The result, or an error object.
    pub result: Result<Arc<Value>, Arc<Value>>,
    /// For a `†a || †b` output path: the alternative the activity chose (rule 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<usize>,
    /// How it ended. Anything but `Ok` (or an `Err` result) is a failure.
    pub kind: OutcomeKind,
}

impl Outcome {
    /// A success.
    pub fn ok(value: Value) -> Self {
        Outcome {
            result: Ok(Arc::new(value)),
            branch: None,
            kind: OutcomeKind::Ok,
        }
    }

    /// An error returned by the activity.
    pub fn error(error: Value) -> Self {
        Outcome {
            result: Err(Arc::new(error)),
            branch: None,
            kind: OutcomeKind::Error,
        }
    }

    /// The call ran past `limit`.
    pub fn timeout(limit: Duration) -> Self {
        Outcome {
            result: Err(Arc::new(error_object(
                "scheduler.timeout",
                format!("the call did not finish within {} ms", limit.as_millis()),
                None,
            ))),
            branch: None,
            kind: OutcomeKind::Timeout,
        }
    }

    /// The activity panicked with `message`.
    pub fn panic(message: impl Into<String>) -> Self {
        Outcome {
            result: Err(Arc::new(error_object(
                "scheduler.panic",
                format!("the activity panicked: {}", message.into()),
                None,
            ))),
            branch: None,
            kind: OutcomeKind::Panic,
        }
    }

    /// The activity was cancelled.
    pub fn cancelled() -> Self {
        Outcome {
            result: Err(Arc::new(error_object(
                "scheduler.cancelled",
                "the call was cancelled",
                None,
            ))),
            branch: None,
            kind: OutcomeKind::Cancelled,
        }
    }

    /// Chooses the output alternative (builder style).
    pub fn with_branch(mut self, branch: usize) -> Self {
        self.branch = Some(branch);
        self
    }
}

/// Where a call ended up.
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CallStatus {
    /// Blocked or waiting for a reviewer (only seen before the step drained).
    Pending,
    /// Its activity is running (only seen before the step drained).
    Running,
    /// Succeeded (a latent call counts as done once stored).
    Done,
    /// Failed: error, timeout or panic.
    Failed,
    /// A reviewer rejected it (or the policy default did after a timeout).
    Rejected,
    /// It could never run: references to nothing once the stream closed.
    Unresolved,
    /// The step was cancelled before it finished.
    Cancelled,
    /// Refused before running: invalid, unknown tool, or it would close a cycle.
    Refused,
    /// Fire-and-forget: launched, not awaited.
    Detached,
}

impl CallStatus {
    /// The status as serialised (`done`, `failed`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            CallStatus::Pending => "pending",
            CallStatus::Running => "running",
            CallStatus::Done => "done",
            CallStatus::Failed => "failed",
            CallStatus::Rejected => "rejected",
            CallStatus::Unresolved => "unresolved",
            CallStatus::Cancelled => "cancelled",
            CallStatus::Refused => "refused",
            CallStatus::Detached => "detached",
        }
    }
}

/// What became of one call of the step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallReport {
    /// The call's id.
    pub id: CallId,
    /// The call as the model wrote it (None when the parser could not read it); shared with
    /// the journal and the `call_received` event.
    pub call: Option<Arc<Call>>,
    /// The call a reviewer's edit or replacement put in its place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revised: Option<Call>,
    /// Where it ended up.
    pub status: CallStatus,
    /// The result, for a call that is done (shared with the state and the `finished` event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Arc<Value>>,
    /// The error object, for a call that failed, was rejected, refused or unresolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Arc<Value>>,
    /// For an unresolved call: the paths that nothing wrote.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
}

/// Every call of the step in arrival order, for the next Request's plan and observations.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct StepReport {
    /// The calls, by id.
    pub calls: Vec<CallReport>,
}

impl StepReport {
    /// The report of one call.
    pub fn get(&self, id: CallId) -> Option<&CallReport> {
        self.calls.iter().find(|c| c.id == id)
    }

    /// How many calls ended with `status`.
    pub fn count(&self, status: CallStatus) -> usize {
        self.calls.iter().filter(|c| c.status == status).count()
    }
}

/// Why the scheduler refused or failed a call. Each becomes the call's error object
/// (`{"code", "message", "details"?}`, [`error_object`]) for the model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SchedulerError {
    /// The parser could not read the call.
    #[error(
        "the call could not be read: {reason}; a call is an object {{\"_tool\": \"<tool name>\", <params>...}} naming one of the tools ({known})"
    )]
    Unreadable {
        /// The parser's explanation, with what was received.
        #[source]
        reason: UnreadableCall,
        /// The available tool names, comma separated.
        known: String,
    },
    /// No tool has this name.
    #[error("unknown tool `{tool}` (available: {known})")]
    UnknownTool {
        /// The name used.
        tool: String,
        /// The available names, comma separated.
        known: String,
    },
    /// A reference or output path does not parse.
    #[error("invalid reference in the call: {0}")]
    Reference(#[from] ReferenceError),
    /// A latent tool's call must carry its result in `_output`.
    #[error("`{tool}` has no activity: the call must carry its result in `_output`")]
    MissingLatentOutput {
        /// The tool.
        tool: String,
    },
    /// The call would close a dependency cycle.
    #[error(transparent)]
    Cycle(#[from] GraphError),
    /// The params do not satisfy the tool (from the configured validator).
    #[error("invalid params for `{tool}`: {reason}")]
    InvalidParams {
        /// The tool.
        tool: String,
        /// What is wrong.
        #[source]
        reason: ValidationError,
    },
    /// A latent call's `_output` does not satisfy its tool's `_output` schema (rule 20).
    #[error("the `_output` of `{tool}` does not match the tool's _output schema: {reason}")]
    InvalidLatentOutput {
        /// The tool.
        tool: String,
        /// What is wrong.
        #[source]
        reason: ValidationError,
    },
    /// A reviewer's edit does not form a valid call.
    #[error("the reviewer's edit does not form a valid call: {reason}")]
    BadEdit {
        /// What is wrong.
        #[source]
        reason: EditError,
    },
    /// Reading state for the call failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// A reviewer rejected the call.
    #[error("a reviewer rejected this call: {reason}. Do not retry it.")]
    Rejected {
        /// The reviewer's reason.
        reason: String,
    },
    /// A reviewer sent the call back: not a veto, the model is to do it differently.
    #[error(
        "a reviewer sent this call back: {feedback}. It did not run; do what it asks differently (a changed call, or another way to the goal)."
    )]
    SentBack {
        /// What the reviewer wants done differently.
        feedback: String,
    },
    /// The stream closed and these references point at nothing.
    #[error("unresolved: nothing wrote {}", .missing.join(", "))]
    Unresolved {
        /// The missing paths.
        missing: Vec<String>,
    },
}

crate::codes::has_code!(SchedulerError);

impl SchedulerError {
    /// A stable code for programs that react to failures.
    pub fn code(&self) -> &'static str {
        match self {
            SchedulerError::Unreadable { .. } => "scheduler.unreadable_call",
            SchedulerError::UnknownTool { .. } => "scheduler.unknown_tool",
            SchedulerError::Reference(_) => "reference.invalid",
            SchedulerError::MissingLatentOutput { .. } => "scheduler.missing_latent_output",
            SchedulerError::Cycle(e) => e.code(),
            SchedulerError::InvalidParams { .. } => "scheduler.invalid_params",
            SchedulerError::InvalidLatentOutput { .. } => "scheduler.invalid_latent_output",
            SchedulerError::BadEdit { .. } => "approval.bad_edit",
            SchedulerError::State(e) => e.code(),
            SchedulerError::Rejected { .. } => "approval.rejected",
            SchedulerError::SentBack { .. } => "approval.sent_back",
            SchedulerError::Unresolved { .. } => "scheduler.unresolved",
        }
    }

    /// The error object shown to the model ([`error_object`]); `details` holds the cycle, the
    /// reviewer's reason (with `retry: false`) or the missing paths.
    pub fn to_value(&self) -> Value {
        let details = match self {
            SchedulerError::Cycle(GraphError::Cycle { cycle }) => Some(json!({"cycle": cycle})),
            SchedulerError::Rejected { reason } => Some(json!({"reason": reason, "retry": false})),
            SchedulerError::SentBack { feedback } => {
                Some(json!({"feedback": feedback, "retry": true}))
            }
            SchedulerError::Unresolved { missing } => Some(json!({"missing": missing})),
            _ => None,
        };
        error_object(self.code(), self.to_string(), details)
    }
}

/// Something the model's stream gave in place of a call that could not be read as one
/// ([`Input::CallArrived`]'s `Err`; it becomes [`SchedulerError::Unreadable`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}{}", received_suffix(.received.as_deref()))]
pub struct UnreadableCall {
    /// Why it could not be read (the parser's explanation).
    pub reason: String,
    /// An excerpt of what was received, when there is one.
    pub received: Option<String>,
}

fn received_suffix(received: Option<&str>) -> String {
    received.map_or_else(String::new, |r| format!("; received {r}"))
}

crate::codes::has_code!(UnreadableCall);

impl UnreadableCall {
    /// Unreadable for `reason`, with nothing quoted.
    pub fn new(reason: impl Into<String>) -> Self {
        UnreadableCall {
            reason: reason.into(),
            received: None,
        }
    }

    /// Quotes an excerpt of what was received (builder style).
    pub fn received(mut self, excerpt: impl Into<String>) -> Self {
        self.received = Some(excerpt.into());
        self
    }

    /// A stable code: `scheduler.unreadable_call`, as the call's refusal.
    pub fn code(&self) -> &'static str {
        "scheduler.unreadable_call"
    }
}

impl From<String> for UnreadableCall {
    fn from(reason: String) -> Self {
        UnreadableCall::new(reason)
    }
}

impl From<&str> for UnreadableCall {
    fn from(reason: &str) -> Self {
        UnreadableCall::new(reason)
    }
}

/// Why a [`Validator`](super::Validator) refused a call's params (or a latent call's
/// `_output`). It becomes [`SchedulerError::InvalidParams`] (or
/// [`SchedulerError::InvalidLatentOutput`]), whose code the call carries.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ValidationError {
    /// The value does not match the schema; the message lists the violations, `; ` apart.
    #[error("{}", join_violations(.violations))]
    Violations {
        /// What is wrong, in the order the validator found it (not empty).
        violations: Vec<Violation>,
    },
    /// The value could not be checked (no schema for the tool).
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// A caller's own validator refused the value, in words (`Err("...".into())`).
    #[error("{message}")]
    Other {
        /// What is wrong.
        message: String,
    },
}

impl From<String> for ValidationError {
    fn from(message: String) -> Self {
        ValidationError::Other { message }
    }
}

impl From<&str> for ValidationError {
    fn from(message: &str) -> Self {
        ValidationError::Other {
            message: message.to_string(),
        }
    }
}

fn join_violations(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl ValidationError {
    /// `Ok` when there is nothing wrong, else the violations.
    pub fn check(violations: Vec<Violation>) -> Result<(), ValidationError> {
        if violations.is_empty() {
            Ok(())
        } else {
            Err(ValidationError::Violations { violations })
        }
    }
}

/// Why a reviewer's edit does not form a call (it becomes [`SchedulerError::BadEdit`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EditError {
    /// The call is gone (nothing to edit).
    #[error("no call to edit")]
    NoCall,
    /// The edit names another tool (changing the tool is a replace, rule 21).
    #[error("an edit keeps the tool `{tool}` (changing the tool is a replace)")]
    ChangesTool {
        /// The call's tool.
        tool: String,
        /// The `_tool` the edit named, as written.
        requested: String,
    },
    /// The edited params do not form a call (a protocol field of the wrong type...).
    #[error(transparent)]
    Invalid(#[from] ProtocolError),
}

/// A call's references and output target parsed ahead of its arrival, by the turn reader as it
/// reads the call (beside the driver when it parses a long answer), so that the scheduler does
/// not parse them again. A cache, not part of what an input says: never journaled (a replay parses again), and
/// two inputs that differ only in it are equal.
#[derive(Clone, Default)]
pub struct Parsed(pub(super) Option<Arc<ParsedParts>>);

/// What [`Call::references`] and [`Call::output_target`] gave.
pub(super) struct ParsedParts {
    pub refs: Result<Vec<(String, crate::protocol::Expression)>, ReferenceError>,
    pub target: Result<Option<crate::protocol::Expression>, ReferenceError>,
}

impl Parsed {
    /// Parses `call`'s references and output target now.
    pub fn of(call: &Call) -> Self {
        Parsed(Some(Arc::new(ParsedParts {
            refs: call.references(),
            target: call.output_target(),
        })))
    }
}

impl PartialEq for Parsed {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for Parsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Parsed" } else { "Parsed(none)" })
    }
}
