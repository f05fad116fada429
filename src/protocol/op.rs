//! Ops: what reviewers, programs and front-ends send *into* a run (DESIGN.md section 3.1).
//!
//! A run is addressed only through ops; events are what comes out. An op that does not apply to
//! the run as it stands is refused with a typed [`OpError`] and changes nothing (rule 21).
//!
//! Also here: [`params_hash`], the fingerprint that binds a decision to the exact call a reviewer
//! was shown.
//!
//! Deliberately not here: deciding whether an op applies (the run machine does) or delivering it
//! (the engine's `RunHandle` does).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Call, CallId, Decision};

/// Something submitted to a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Op {
    /// A reviewer's decision about a call awaiting approval.
    Decide {
        /// The call (ids are unique across the run, delegates included).
        call: CallId,
        /// The decision.
        decision: Decision,
        /// The `params_hash` of the approval request the reviewer saw. When given and the call
        /// was since presented with other params, the op is refused as stale.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        presented: Option<String>,
        /// The presentation the decision answers: the `seq` of the call's `approval_requested`
        /// event (DESIGN.md 3.6). A decision answers that presentation only: once the call is
        /// presented again (interrupted by a restart, sent back by a replacement), it is refused
        /// (`op.stale_presentation`). When omitted (an older client), whoever records the op
        /// fills in the presentation its check saw.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        presentation: Option<u64>,
        /// Who decided, through which channel (journaled with the decision).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    /// A reviewer's standing approval: approve calls ahead of their presentation (journaled;
    /// revocable while the run lasts). Not a grant: grants are what the operator lets a goal
    /// touch (DESIGN.md 3.3). Journals and clients from before the rename send it as `grant`
    /// with the field `grant`; both still read.
    #[serde(alias = "grant")]
    Allow {
        /// What it covers.
        #[serde(alias = "grant")]
        standing: StandingSpec,
        /// Who gave it, through which channel.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    /// Withdraw a standing approval: calls presented from now on are no longer covered by it.
    Revoke {
        /// The standing approval's id (`g1`...; read as `grant` from older journals).
        #[serde(alias = "grant")]
        standing: String,
        /// Who revoked, through which channel.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
    /// A call awaiting a decision is shown to somebody (a terminal prompt, the page, the API):
    /// its reviewer timeout, if the policy sets one, starts now. Refused once it has started
    /// (`op.already_shown`) or when the presentation is not the call's current one.
    Shown {
        /// The call.
        call: CallId,
        /// The presentation shown (the `seq` of the call's `approval_requested` event).
        presentation: u64,
    },
    /// Stop the run: nothing more launches, running calls are aborted.
    Cancel {
        /// Why, in the canceller's words.
        reason: String,
        /// Who cancelled, through which channel (journaled with the cancellation).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<Actor>,
    },
}

/// What a reviewer's standing approval approves ahead of time. It never covers a call
/// interrupted by a restart (somebody must say whether it runs again).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[serde(tag = "scope", rename_all = "snake_case")]
#[non_exhaustive]
pub enum StandingSpec {
    /// Every call of this tool presented while the approval lasts (those awaiting included),
    /// optionally only those whose params satisfy `when` (a JSON Schema over the params, as an
    /// approval rule's `when` sees them).
    Tool {
        /// The tool's name.
        tool: String,
        /// A JSON Schema the call must satisfy.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        when: Option<Value>,
    },
    /// Exactly these calls, each as it was presented: a call is covered only while its params
    /// hash is the one listed (as presented, or as written for a call still blocked). A call
    /// that is not listed (one added later) is not covered.
    Calls {
        /// The calls and their params hashes.
        calls: Vec<StandingCall>,
    },
}

/// One call of a [`StandingSpec::Calls`] standing approval.
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StandingCall {
    /// The call.
    pub call: CallId,
    /// Its params hash, as presented to the reviewer.
    pub params_hash: String,
}

/// Who made a decision or a cancellation, and through which channel. Recorded in the journal
/// and shown with the call (`decided_by`) or the run (`cancelled_by`).
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor {
    /// The principal's name (an HTTP principal, the terminal's user, `policy`, ...).
    pub principal: String,
    /// How it reached the run: [`Actor::HTTP`], [`Actor::TERMINAL`], [`Actor::DECISIONS_FILE`],
    /// [`Actor::POLICY`], [`Actor::TIMEOUT`] or [`Actor::CLI`].
    pub channel: String,
}

impl Actor {
    /// Through `dagloop serve`'s API (the reviewer page included).
    pub const HTTP: &'static str = "http";
    /// At the terminal reviewer of `dagloop run`.
    pub const TERMINAL: &'static str = "terminal";
    /// From a scripted decisions file (`--decisions`).
    pub const DECISIONS_FILE: &'static str = "decisions_file";
    /// By the approval policy.
    pub const POLICY: &'static str = "policy";
    /// By a reviewer timeout's default.
    pub const TIMEOUT: &'static str = "timeout";
    /// By a command (`dagloop decide`).
    pub const CLI: &'static str = "cli";

    /// This principal through this channel.
    pub fn new(principal: impl Into<String>, channel: &str) -> Actor {
        Actor {
            principal: principal.into(),
            channel: channel.to_string(),
        }
    }
}

/// Why an op was refused. Nothing changed in the run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum OpError {
    /// No call has this id in the run.
    #[error("the run has no call {call}")]
    UnknownCall {
        /// The id given.
        call: CallId,
    },
    /// The call exists but is not waiting for a reviewer (still blocked, running or finished).
    #[error("call {call} is not awaiting a decision (it is {status})")]
    NotAwaiting {
        /// The call.
        call: CallId,
        /// What it is doing instead.
        status: String,
    },
    /// Somebody (another reviewer, the policy's timeout default) decided first.
    #[error("call {call} was already decided ({decision}{})", by.as_ref().map_or_else(String::new, |b| format!(" by {b}")))]
    AlreadyDecided {
        /// The call.
        call: CallId,
        /// The decision that won, in words.
        decision: String,
        /// Who made it (a principal), when known.
        by: Option<String>,
    },
    /// The decision answers a presentation of the call that is no longer the current one: the
    /// call was presented again since (after a restart, or a replacement by another tool), and
    /// a decision given before a presentation never answers it.
    #[error(
        "call {call} was presented again since (the decision answers presentation {presented}, the call now awaits a decision on presentation {current}{})",
        if *current == 0 { ", or none".to_string() } else { String::new() }
    )]
    StalePresentation {
        /// The call.
        call: CallId,
        /// The presentation the decision named.
        presented: u64,
        /// The presentation awaiting a decision now (0: none).
        current: u64,
    },
    /// The run moved on between the op's check and its recording (its journal grew), more
    /// often than the recorder tries again: check the run again and resend.
    #[error(
        "the run moved on while the op was checked (its journal grew from {seen} to {now} entries); look at the run again and resend"
    )]
    Moved {
        /// The journal length the check saw.
        seen: u64,
        /// The journal length found when recording.
        now: u64,
    },
    /// The call's reviewer clock already runs (it was shown before), or it has none.
    #[error("call {call}'s reviewer deadline already runs, or it has none")]
    AlreadyShown {
        /// The call.
        call: CallId,
    },
    /// The call now awaits a decision about other params than the ones the reviewer saw.
    #[error("call {call} was presented with other params (seen {presented}, now {current})")]
    Stale {
        /// The call.
        call: CallId,
        /// The fingerprint the reviewer saw.
        presented: String,
        /// The fingerprint of what awaits a decision now.
        current: String,
    },
    /// An edit tried to change the tool (changing the tool is a replace).
    #[error(
        "an edit keeps the tool: call {call} is `{tool}`, the edit names `{requested}` (use replace)"
    )]
    EditChangesTool {
        /// The call.
        call: CallId,
        /// Its tool.
        tool: String,
        /// The tool the edit named.
        requested: String,
    },
    /// The decision cannot apply: the replacing tool is unknown, or the params do not satisfy
    /// the tool's schema.
    #[error("the decision about call {call} cannot apply: {reason}")]
    InvalidDecision {
        /// The call.
        call: CallId,
        /// What is wrong.
        reason: String,
    },
    /// No standing approval has this id in the run, or it was already revoked.
    #[error("the run has no standing approval `{id}` in force")]
    UnknownStanding {
        /// The id given.
        id: String,
    },
    /// The standing approval cannot apply (an unknown tool, a `when` that is not a schema, an
    /// empty list).
    #[error("the standing approval cannot apply: {reason}")]
    InvalidStanding {
        /// What is wrong.
        reason: String,
    },
    /// The run has ended; it takes no more ops.
    #[error("the run has finished ({status})")]
    RunFinished {
        /// Its terminal status.
        status: String,
    },
    /// The run's driver is gone (the process is shutting down) or its journal failed.
    #[error("the run cannot take ops: {reason}")]
    Unavailable {
        /// Why.
        reason: String,
    },
}

crate::codes::has_code!(OpError);

impl OpError {
    /// `op.already_decided` for call `call`, naming `winner`: the decision that holds the
    /// presentation (another process recorded it first).
    pub fn decided_first(call: CallId, winner: &Op) -> OpError {
        let (decision, by) = match winner {
            Op::Decide { decision, by, .. } => (
                decision.name().to_string(),
                by.as_ref().map(|b| b.principal.clone()),
            ),
            other => (format!("{other:?}"), None),
        };
        OpError::AlreadyDecided { call, decision, by }
    }

    /// A stable code for programs that react to refusals.
    pub fn code(&self) -> &'static str {
        match self {
            OpError::UnknownCall { .. } => "op.unknown_call",
            OpError::NotAwaiting { .. } => "op.not_awaiting",
            OpError::AlreadyDecided { .. } => "op.already_decided",
            OpError::Stale { .. } | OpError::Moved { .. } => "op.stale",
            OpError::StalePresentation { .. } => "op.stale_presentation",
            OpError::AlreadyShown { .. } => "op.already_shown",
            OpError::EditChangesTool { .. } => "op.edit_changes_tool",
            OpError::InvalidDecision { .. } => "op.invalid_decision",
            OpError::UnknownStanding { .. } => "op.unknown_standing_approval",
            OpError::InvalidStanding { .. } => "op.invalid_standing_approval",
            OpError::RunFinished { .. } => "op.run_finished",
            OpError::Unavailable { .. } => "op.unavailable",
        }
    }
}

/// The fingerprint of a call as presented (tool, params, output path and method): 16 hex digits
/// of FNV-1a over its canonical JSON (object keys sorted), so the same call always gives the same
/// hash whatever order its keys were written in.
pub fn params_hash(call: &Call) -> String {
    let canonical = canonical(&call.to_value());
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in canonical.to_string().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// `v` with every object's keys sorted, so equal values print equally whatever order their keys
/// were written in.
pub fn canonical(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let sorted: BTreeMap<&String, Value> =
                m.iter().map(|(k, x)| (k, canonical(x))).collect();
            Value::Object(sorted.into_iter().map(|(k, x)| (k.clone(), x)).collect())
        }
        Value::Array(a) => Value::Array(a.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hash_ignores_key_order_and_sees_every_value() {
        let a = Call::try_from(json!({"_tool": "t", "a": 1, "b": {"x": 1, "y": 2}})).expect("call");
        let b = Call::try_from(json!({"b": {"y": 2, "x": 1}, "a": 1, "_tool": "t"})).expect("call");
        let c = Call::try_from(json!({"_tool": "t", "a": 2, "b": {"x": 1, "y": 2}})).expect("call");
        let d = Call::try_from(json!({"_tool": "u", "a": 1, "b": {"x": 1, "y": 2}})).expect("call");
        assert_eq!(params_hash(&a), params_hash(&b));
        assert_ne!(params_hash(&a), params_hash(&c));
        assert_ne!(params_hash(&a), params_hash(&d));
        assert_eq!(params_hash(&a).len(), 16);
    }

    #[test]
    fn ops_have_a_tagged_wire_shape() {
        let op: Op = serde_json::from_value(json!({"op": "decide", "call": 3,
            "decision": {"decision": "reject", "reason": "no"}}))
        .expect("op");
        assert_eq!(
            op,
            Op::Decide {
                call: CallId(3),
                decision: Decision::Reject {
                    reason: "no".into()
                },
                presented: None,
                presentation: None,
                by: None,
            }
        );
        let back = serde_json::to_value(&Op::Cancel {
            reason: "stop".into(),
            by: None,
        })
        .expect("json");
        assert_eq!(back, json!({"op": "cancel", "reason": "stop"}));
        let by = Some(Actor::new("alice", Actor::HTTP));
        let back = serde_json::to_value(&Op::Cancel {
            reason: "stop".into(),
            by: by.clone(),
        })
        .expect("json");
        assert_eq!(
            back,
            json!({"op": "cancel", "reason": "stop", "by": {"principal": "alice", "channel": "http"}})
        );
        let op: Op = serde_json::from_value(back).expect("op");
        assert!(matches!(op, Op::Cancel { by: b, .. } if b == by));
    }
}
