//! Events: the one typed record of everything that happens in a run, in order.
//!
//! The scheduler and the outer loop produce [`EventKind`]s; the run's machine stamps them with a
//! per-run sequence number, the step and a timestamp, giving an [`Event`]. Events are what the
//! store persists, what the CLI prints and what the server streams; a run can be rebuilt by
//! replaying them.
//!
//! Also here: [`Decision`], a reviewer's answer about one call, because events record it and
//! this module imports nothing from the rest of the crate.
//!
//! Deliberately not here: assigning sequence numbers (the run's machine does), reading clocks
//! (the engine does), sanitising results (events carry full values; the context builder
//! sanitises what the model sees).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{Call, CallId, Millis, OutputMethod, PathText};

/// The resolved params of a launched call, as its `started` event carries them: a share of the
/// call the activity runs, so launching a call copies no params. Reads as the params object
/// (`Deref`) and serialises as one; a deserialised one holds a call of those params alone.
#[derive(Debug, Clone)]
pub struct LaunchedParams(Arc<Call>);

impl LaunchedParams {
    /// The params of `call`, shared with it.
    pub fn of(call: Arc<Call>) -> Self {
        LaunchedParams(call)
    }

    /// The params object.
    pub fn as_map(&self) -> &Map<String, Value> {
        &self.0.params
    }

    /// True when these are the params of `call` itself, not a copy.
    pub fn is_of(&self, call: &Arc<Call>) -> bool {
        Arc::ptr_eq(&self.0, call)
    }
}

impl std::ops::Deref for LaunchedParams {
    type Target = Map<String, Value>;

    fn deref(&self) -> &Map<String, Value> {
        &self.0.params
    }
}

impl From<Map<String, Value>> for LaunchedParams {
    fn from(params: Map<String, Value>) -> Self {
        let mut call = Call::new("");
        call.params = params.into();
        LaunchedParams(Arc::new(call))
    }
}

impl PartialEq for LaunchedParams {
    fn eq(&self, other: &Self) -> bool {
        self.0.params == other.0.params
    }
}

impl Serialize for LaunchedParams {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.params.serialize(s)
    }
}

impl<'de> Deserialize<'de> for LaunchedParams {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Map::<String, Value>::deserialize(d).map(LaunchedParams::from)
    }
}

/// The tool name of a launched call, as its `started` event carries it: read from the same
/// share of the call as its [`LaunchedParams`], so launching a call copies no name (the event
/// holds two counts on the call, no text). Reads as the name (`Deref<Target = str>`) and
/// serialises as one; a deserialised one holds a call of that name alone.
#[derive(Debug, Clone)]
pub struct LaunchedTool(Arc<Call>);

impl LaunchedTool {
    /// The tool name of `call`, shared with it.
    pub fn of(call: Arc<Call>) -> Self {
        LaunchedTool(call)
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0.tool
    }

    /// True when this is the name of `call` itself, not a copy.
    pub fn is_of(&self, call: &Arc<Call>) -> bool {
        Arc::ptr_eq(&self.0, call)
    }
}

impl std::ops::Deref for LaunchedTool {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0.tool
    }
}

impl std::fmt::Display for LaunchedTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.tool)
    }
}

impl From<&str> for LaunchedTool {
    fn from(tool: &str) -> Self {
        LaunchedTool(Arc::new(Call::new(tool)))
    }
}

impl From<String> for LaunchedTool {
    fn from(tool: String) -> Self {
        LaunchedTool(Arc::new(Call::new(tool)))
    }
}

impl PartialEq for LaunchedTool {
    fn eq(&self, other: &Self) -> bool {
        self.0.tool == other.0.tool
    }
}

impl Serialize for LaunchedTool {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0.tool)
    }
}

impl<'de> Deserialize<'de> for LaunchedTool {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(LaunchedTool::from)
    }
}

/// One stamped event of a run.
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The run the event belongs to (empty when the run was given no id). Shared by every
    /// event of the run.
    #[serde(default, skip_serializing_if = "str::is_empty")]
    pub run_id: Arc<str>,
    /// Per-run sequence number, strictly increasing from 1 without gaps.
    pub seq: u64,
    /// The step (Request number) the event belongs to.
    pub step: u32,
    /// When it was published (milliseconds since the Unix epoch, from the engine's clock).
    #[cfg_attr(feature = "server", schema(value_type = u64))]
    pub at: Millis,
    /// The call it concerns, if any. Serialised as `call_id` (some kinds carry a `call` body).
    #[serde(rename = "call_id", default, skip_serializing_if = "Option::is_none")]
    pub call: Option<CallId>,
    /// For an event of a nested agent (a delegate): the parent's call that runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<CallId>,
    /// How deep the agent that produced the event is nested (0 for the run's own agent).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub depth: u32,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// How a call failed.
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FailKind {
    /// The activity returned an error.
    Error,
    /// The activity did not finish within the call timeout.
    Timeout,
    /// The activity panicked.
    Panic,
    /// A reviewer (or the policy default after a timeout) rejected the call.
    Rejected,
    /// The activity itself reported that it was cancelled.
    Cancelled,
}

impl FailKind {
    /// The kind's name as serialised.
    pub fn as_str(self) -> &'static str {
        match self {
            FailKind::Error => "error",
            FailKind::Timeout => "timeout",
            FailKind::Panic => "panic",
            FailKind::Rejected => "rejected",
            FailKind::Cancelled => "cancelled",
        }
    }
}

/// A reviewer's answer about a call presented for approval (rule 13).
///
/// Serialised with a `decision` tag: `{"decision": "approve"}`,
/// `{"decision": "edit", "params": {...}}`, `{"decision": "replace", "call": {...}}`,
/// `{"decision": "reject", "reason": "..."}`.
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Decision {
    /// Run the call as presented.
    Approve,
    /// Run the call with these params instead. References in them are resolved again; meta
    /// fields (`_outputPath`, `_outputMethod`) in the map override the original's.
    Edit {
        /// The new params.
        params: Map<String, Value>,
    },
    /// Run a different call in this one's place (same call id).
    Replace {
        /// The call to run instead (boxed: it keeps every decision, and every event and input
        /// that carries one, small).
        call: Box<Call>,
    },
    /// Do not run the call; the model is told why and not to retry it.
    Reject {
        /// Why, in the reviewer's words.
        reason: String,
    },
    /// Do not run the call, and tell the model to do it differently: not a veto (the model is
    /// told what the reviewer wants instead and may propose another call).
    SendBack {
        /// What to do differently, in the reviewer's words.
        feedback: String,
    },
    /// Only for a call interrupted by a restart: it did happen; this is its result (the
    /// reviewer's receipt). The result is written as if the activity had returned it.
    Done {
        /// The call's result.
        result: Value,
    },
}

/// What happened. Serialised internally tagged with `type`, in snake_case.
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    // ----- the inner loop (scheduler) -----
    /// A call arrived from the model's stream (as written).
    CallReceived {
        /// The call as the model wrote it (shared with the run's journal, not a copy).
        call: Arc<Call>,
    },
    /// A call was refused before it could run: invalid, unknown tool, or it would close a cycle.
    CallRefused {
        /// Why, in words meant for the model.
        reason: String,
        /// For a cycle: the call ids around it, starting with the refused call.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        cycle: Vec<CallId>,
    },
    /// A call waits on paths that pending or running calls may still write (or that are absent
    /// while the stream is open).
    Blocked {
        /// The awaited paths, as `kind.path` strings.
        #[cfg_attr(feature = "server", schema(value_type = Vec<String>))]
        waiting_on: Vec<PathText>,
    },
    /// Every reference of a blocked call can now be resolved.
    Unblocked,
    /// A call was presented for approval, with its params resolved.
    ApprovalRequested {
        // Shared with the scheduler's `Ask` action and the call it keeps as presented (and with
        // the call as written when it has no references): the event copies nothing.
        /// The call with references replaced by values (shared, to keep every event small).
        call: Arc<Call>,
        /// The call's path through nested agents: the delegate calls above it, outermost first,
        /// then the call itself.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        path: Vec<CallId>,
        /// The fingerprint of the call as presented ([`super::params_hash`]); a decision may
        /// quote it so that it only applies to exactly this presentation (rule 21).
        #[serde(default)]
        params_hash: String,
        /// The call had started before the run stopped and was not known to finish: a reviewer
        /// decides whether it runs again.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        interrupted: bool,
        /// The approval rule that asked (a rule's name, `_approval`, `policy:ask`...).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rule: Option<String>,
        /// The calls whose writes the presented params were resolved from, in id order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        read_from: Vec<CallId>,
    },
    /// A reviewer decided, or the policy default applied after a reviewer timeout.
    Decision {
        /// The decision.
        decision: Decision,
        /// True when the policy default was applied because the reviewer did not answer in time.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        timed_out: bool,
        /// Who decided, when the decision's op said so.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<super::Actor>,
        /// The approval rule the decision came from (a `deny` rule).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rule: Option<String>,
        /// The standing approval the decision came from (`g1`...; `grant` in older journals).
        #[serde(default, skip_serializing_if = "Option::is_none", alias = "grant")]
        standing: Option<String>,
    },
    /// A decision recorded for the call was not applied: by the time its run's driver took it
    /// from the store's queue, the presentation it answered had been decided otherwise (the
    /// policy's timeout) or replaced by a new one (the call was interrupted by a restart and
    /// presented again). Nothing ran because of it; it is in the audit.
    DecisionDropped {
        /// The decision.
        decision: Decision,
        /// Who made it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<super::Actor>,
        /// The presentation it answered (the `seq` of an `approval_requested` event).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        presentation: Option<u64>,
        /// Why it no longer applied (an op refusal's code: `op.stale_presentation`...).
        code: String,
    },
    /// A reviewer gave a standing approval ahead of the calls (journaled; applies until revoked
    /// or the run ends). Journals from before the rename call it `grant_added`, its field
    /// `grant`.
    #[serde(alias = "grant_added")]
    StandingApprovalAdded {
        /// Its id in the run (`g1`, `g2`... in the order they were given).
        id: String,
        /// What it covers.
        #[serde(alias = "grant")]
        standing: super::StandingSpec,
        /// Who gave it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<super::Actor>,
    },
    /// A standing approval was revoked: it covers no call presented from now on (`grant_revoked`
    /// in older journals).
    #[serde(alias = "grant_revoked")]
    StandingApprovalRevoked {
        /// Its id.
        id: String,
        /// Who revoked it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<super::Actor>,
    },
    /// An activity was launched.
    Started {
        // The launched call's own name, shared with the activity like its params.
        /// The tool name.
        #[cfg_attr(feature = "server", schema(value_type = String))]
        tool: LaunchedTool,
        // The launched call's own params, shared with the activity (not a copy).
        /// The resolved params.
        #[cfg_attr(feature = "server", schema(value_type = Map<String, Value>))]
        params: LaunchedParams,
        /// The calls whose writes the params were resolved from (the data it waited on), in id
        /// order: its dependency edges as they were when it launched. Empty when it read
        /// nothing a call wrote.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        read_from: Vec<CallId>,
    },
    /// A running call reported progress (an MCP server's `notifications/progress`, or any
    /// activity's progress sink). Live only, like `model_delta`:
    /// never journaled, carries the sequence number of the event before it, and is not replayed.
    CallProgress {
        /// Progress so far.
        progress: f64,
        /// The total, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        total: Option<f64>,
        /// The activity's message.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// A call succeeded. The result is the full value (not sanitised), shared with the state's
    /// write and the journal: a kept event costs no copy of it.
    Finished {
        /// The result.
        result: Arc<Value>,
    },
    /// A call failed; the error is its observation for the model.
    Failed {
        /// The error object (shared like a `finished` result).
        error: Arc<Value>,
        /// How it failed.
        kind: FailKind,
    },
    /// A call's result (or error, on a branch) was appended to state.
    Written {
        /// Where, as a `kind.path` string.
        #[cfg_attr(feature = "server", schema(value_type = String))]
        path: PathText,
        /// How it combines with earlier writes.
        method: OutputMethod,
        /// The write's position in the state log (`seq` would clash with the event's own).
        write_seq: u64,
    },
    /// A call can never run: the stream closed and these references point at nothing.
    Unresolved {
        /// The missing paths.
        #[cfg_attr(feature = "server", schema(value_type = Vec<String>))]
        missing: Vec<PathText>,
    },
    /// A call was cancelled (the inner loop was cancelled before it finished).
    Cancelled,
    /// The inner loop of this step has nothing left to do.
    StepDrained,

    // ----- the outer loop (engine) -----
    /// A run began.
    RunStarted {
        /// The goal text.
        goal: String,
    },
    /// A Request to the model began (attempt counts retries within the step, from 1).
    RequestStarted {
        /// The attempt number.
        attempt: u32,
    },
    /// A model attempt failed and is retried after a wait (rule 17).
    ModelRetry {
        /// The attempt that failed (from 1).
        attempt: u32,
        /// The provider's HTTP status, when there was one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<u16>,
        /// How long the engine waits before the next attempt.
        wait_ms: u64,
        /// Why the attempt failed.
        error: String,
    },
    /// The model answering the turn failed after its retries with an error another provider
    /// could fix; the same request goes to the next model of the agent's list.
    ModelFallback {
        /// The display name of the model that failed.
        from: String,
        /// The display name of the model asked now.
        to: String,
        /// The stable code of the error (`llm.http_status`, `llm.transport`...).
        code: String,
        /// The error, in words.
        error: String,
    },
    /// The turn's context was compacted: the provider said it does not fit the model's window
    /// (`llm.context_overflow`) and the turn is asked again compacted further (to the least
    /// level that fits when the refusal named the window), or, the window being known from an
    /// earlier refusal, the step's context was compacted before it was asked.
    ContextCompacted {
        /// The size of the compacted context (characters of its messages as JSON).
        chars: u64,
        /// The compaction level (from 1; each level drops more than the one before).
        #[serde(default)]
        level: u8,
        /// The size of the context the provider refused (characters of its messages as JSON);
        /// absent when the context was compacted before it was asked.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        refused_chars: Option<u64>,
    },
    /// The model's stream broke after its content had started: the turn is asked once more of
    /// the same model without streaming (the calls already received are kept).
    StreamReasked {
        /// The display name of the model asked again.
        model: String,
        /// The stable code of the error that broke the stream (`llm.transport`...).
        code: String,
        /// The error, in words.
        error: String,
        /// Calls of the turn received before the break (the whole answer's first ones are
        /// skipped in their place).
        calls_kept: u64,
    },
    /// The model streamed more text. Live only: never journaled, carries the sequence number of
    /// the event before it, and is not replayed to late subscribers.
    ModelDelta {
        /// How many characters arrived.
        chars: u64,
        /// The text that arrived (what a provider streamed, or the whole answer at once from
        /// one that does not stream).
        #[serde(default)]
        text: String,
    },
    /// The model's Solution for this step is complete.
    Solution {
        /// Whether `output` was non-null.
        output_present: bool,
    },
    /// The Solution's output did not validate against the user's schema.
    OutputInvalid {
        /// The validation errors.
        errors: Vec<String>,
    },
    /// The run ended.
    RunFinished {
        /// The terminal status (`succeeded`, `failed`, `cancelled`, ...).
        status: String,
        /// For a run that was cancelled: who cancelled it, when the cancellation said so.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<super::Actor>,
    },
}

impl Decision {
    /// The decision's tag: `approve`, `edit`, `replace`, `reject` or `done`.
    pub fn name(&self) -> &'static str {
        match self {
            Decision::Approve => "approve",
            Decision::Edit { .. } => "edit",
            Decision::Replace { .. } => "replace",
            Decision::Reject { .. } => "reject",
            Decision::SendBack { .. } => "send_back",
            Decision::Done { .. } => "done",
        }
    }
}

impl EventKind {
    /// True for events that are broadcast live but never journaled nor replayed.
    pub fn is_ephemeral(&self) -> bool {
        matches!(
            self,
            EventKind::ModelDelta { .. } | EventKind::CallProgress { .. }
        )
    }

    /// The `type` tag of this kind.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::CallReceived { .. } => "call_received",
            EventKind::CallRefused { .. } => "call_refused",
            EventKind::Blocked { .. } => "blocked",
            EventKind::Unblocked => "unblocked",
            EventKind::ApprovalRequested { .. } => "approval_requested",
            EventKind::Decision { .. } => "decision",
            EventKind::DecisionDropped { .. } => "decision_dropped",
            EventKind::StandingApprovalAdded { .. } => "standing_approval_added",
            EventKind::StandingApprovalRevoked { .. } => "standing_approval_revoked",
            EventKind::Started { .. } => "started",
            EventKind::CallProgress { .. } => "call_progress",
            EventKind::Finished { .. } => "finished",
            EventKind::Failed { .. } => "failed",
            EventKind::Written { .. } => "written",
            EventKind::Unresolved { .. } => "unresolved",
            EventKind::Cancelled => "cancelled",
            EventKind::StepDrained => "step_drained",
            EventKind::RunStarted { .. } => "run_started",
            EventKind::RequestStarted { .. } => "request_started",
            EventKind::ModelRetry { .. } => "model_retry",
            EventKind::ModelFallback { .. } => "model_fallback",
            EventKind::ContextCompacted { .. } => "context_compacted",
            EventKind::StreamReasked { .. } => "stream_reasked",
            EventKind::ModelDelta { .. } => "model_delta",
            EventKind::Solution { .. } => "solution",
            EventKind::OutputInvalid { .. } => "output_invalid",
            EventKind::RunFinished { .. } => "run_finished",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Events written before a reviewer's standing approval got its own name (`grant_added`,
    /// `grant_revoked`, a decision's `grant`) read as the renamed kinds.
    #[test]
    fn events_from_before_the_standing_approval_rename_load() {
        let added: EventKind = serde_json::from_value(json!({"type": "grant_added", "id": "g1",
            "grant": {"scope": "tool", "tool": "refund"}}))
        .expect("grant_added");
        assert!(
            matches!(&added, EventKind::StandingApprovalAdded { id, standing: super::super::StandingSpec::Tool { tool, .. }, .. } if id == "g1" && tool == "refund"),
            "{added:?}"
        );
        let revoked: EventKind =
            serde_json::from_value(json!({"type": "grant_revoked", "id": "g1"})).expect("revoked");
        assert!(matches!(&revoked, EventKind::StandingApprovalRevoked { id, .. } if id == "g1"));
        let decided: EventKind = serde_json::from_value(
            json!({"type": "decision", "decision": {"decision": "approve"}, "grant": "g1"}),
        )
        .expect("decision");
        assert!(
            matches!(&decided, EventKind::Decision { standing: Some(g), .. } if g == "g1"),
            "{decided:?}"
        );
        assert_eq!(
            serde_json::to_value(&added).expect("json")["type"],
            "standing_approval_added"
        );
        // The ops too (a queue of ops written before the rename).
        let op: super::super::Op = serde_json::from_value(
            json!({"op": "grant", "grant": {"scope": "calls", "calls": []}}),
        )
        .expect("op grant");
        assert!(matches!(op, super::super::Op::Allow { .. }), "{op:?}");
        let op: super::super::Op =
            serde_json::from_value(json!({"op": "revoke", "grant": "g2"})).expect("op revoke");
        assert!(matches!(&op, super::super::Op::Revoke { standing, .. } if standing == "g2"));
    }

    fn all_kinds() -> Vec<EventKind> {
        let call = Call::new("fetch").param("q", "†state.x").output("†state.y");
        vec![
            EventKind::CallReceived {
                call: Arc::new(call.clone()),
            },
            EventKind::CallRefused {
                reason: "cycle".into(),
                cycle: vec![CallId(2), CallId(1)],
            },
            EventKind::CallRefused {
                reason: "unknown tool".into(),
                cycle: vec![],
            },
            EventKind::Blocked {
                waiting_on: vec!["state.x".into()],
            },
            EventKind::Unblocked,
            EventKind::ApprovalRequested {
                call: Arc::new(call.clone()),
                path: vec![CallId(1), CallId(4)],
                params_hash: "00ff".into(),
                interrupted: true,
                rule: Some("policy:ask".into()),
                read_from: vec![CallId(2)],
            },
            EventKind::ModelRetry {
                attempt: 1,
                status: Some(429),
                wait_ms: 250,
                error: "rate limited".into(),
            },
            EventKind::Decision {
                decision: Decision::Approve,
                timed_out: false,
                by: Some(crate::protocol::Actor::new(
                    "alice",
                    crate::protocol::Actor::HTTP,
                )),
                rule: None,
                standing: Some("g1".into()),
            },
            EventKind::Decision {
                decision: Decision::Done {
                    result: json!({"receipt": "R-1"}),
                },
                timed_out: false,
                by: None,
                rule: None,
                standing: None,
            },
            EventKind::StandingApprovalAdded {
                id: "g1".into(),
                standing: crate::protocol::StandingSpec::Tool {
                    tool: "fetch".into(),
                    when: Some(json!({"type": "object"})),
                },
                by: None,
            },
            EventKind::StandingApprovalAdded {
                id: "g2".into(),
                standing: crate::protocol::StandingSpec::Calls {
                    calls: vec![crate::protocol::StandingCall {
                        call: CallId(3),
                        params_hash: "00ff".into(),
                    }],
                },
                by: Some(crate::protocol::Actor::new(
                    "alice",
                    crate::protocol::Actor::TERMINAL,
                )),
            },
            EventKind::StandingApprovalRevoked {
                id: "g1".into(),
                by: None,
            },
            EventKind::DecisionDropped {
                decision: Decision::Approve,
                by: Some(crate::protocol::Actor::new(
                    "bob",
                    crate::protocol::Actor::CLI,
                )),
                presentation: Some(7),
                code: "op.stale_presentation".into(),
            },
            EventKind::Decision {
                decision: Decision::Edit {
                    params: json!({"q": 1}).as_object().cloned().unwrap_or_default(),
                },
                timed_out: false,
                by: None,
                rule: None,
                standing: None,
            },
            EventKind::Decision {
                decision: Decision::Replace {
                    call: Box::new(call.clone()),
                },
                timed_out: false,
                by: None,
                rule: None,
                standing: None,
            },
            EventKind::Decision {
                decision: Decision::Reject {
                    reason: "no".into(),
                },
                timed_out: true,
                by: None,
                rule: Some("huge".into()),
                standing: None,
            },
            EventKind::Started {
                tool: "fetch".into(),
                params: Map::new().into(),
                read_from: vec![CallId(3), CallId(7)],
            },
            EventKind::CallProgress {
                progress: 2.0,
                total: Some(5.0),
                message: Some("step 2 of 5".into()),
            },
            EventKind::CallProgress {
                progress: 0.5,
                total: None,
                message: None,
            },
            EventKind::Finished {
                result: json!({"ok": true}).into(),
            },
            EventKind::Failed {
                error: json!({"error": "boom"}).into(),
                kind: FailKind::Panic,
            },
            EventKind::Written {
                path: "state.y".into(),
                method: OutputMethod::Merge,
                write_seq: 4,
            },
            EventKind::Unresolved {
                missing: vec!["state.z".into()],
            },
            EventKind::Cancelled,
            EventKind::StepDrained,
            EventKind::RunStarted { goal: "g".into() },
            EventKind::RequestStarted { attempt: 2 },
            EventKind::ModelDelta {
                chars: 17,
                text: "{\"calls\": []}".into(),
            },
            EventKind::Solution {
                output_present: true,
            },
            EventKind::OutputInvalid {
                errors: vec!["/status: required".into()],
            },
            EventKind::RunFinished {
                status: "succeeded".into(),
                by: None,
            },
            EventKind::RunFinished {
                status: "cancelled".into(),
                by: Some(crate::protocol::Actor::new(
                    "ci",
                    crate::protocol::Actor::HTTP,
                )),
            },
        ]
    }

    #[test]
    fn every_kind_round_trips_through_json() {
        for (i, kind) in all_kinds().into_iter().enumerate() {
            let ev = Event {
                run_id: "run-1".into(),
                seq: i as u64 + 1,
                step: 3,
                at: 1_700_000_000_000,
                call: (i % 2 == 0).then_some(CallId(i as u64)),
                parent: (i % 3 == 0).then_some(CallId(1)),
                depth: (i % 3 == 0) as u32,
                kind,
            };
            let text = serde_json::to_string(&ev).expect("serialise");
            let back: Event = serde_json::from_str(&text).expect("deserialise");
            assert_eq!(back, ev, "{text}");
            let v: Value = serde_json::from_str(&text).expect("json");
            assert_eq!(v["type"], json!(ev.kind.name()), "{text}");
        }
    }

    #[test]
    fn wire_shape_is_flat_and_snake_case() {
        let ev = Event {
            run_id: Arc::from(""),
            seq: 7,
            step: 1,
            at: 5,
            call: Some(CallId(3)),
            parent: None,
            depth: 0,
            kind: EventKind::Failed {
                error: json!({"error": "late"}).into(),
                kind: FailKind::Timeout,
            },
        };
        assert_eq!(
            serde_json::to_value(&ev).expect("json"),
            json!({"seq": 7, "step": 1, "at": 5, "call_id": 3, "type": "failed",
                   "error": {"error": "late"}, "kind": "timeout"})
        );
        let d: Decision =
            serde_json::from_value(json!({"decision": "reject", "reason": "too risky"}))
                .expect("decision");
        assert_eq!(
            d,
            Decision::Reject {
                reason: "too risky".into()
            }
        );
    }
}
