//! The approval gate (rules 13 and 14): policies as data, a pure [`assess`], and the
//! [`Approver`] seam through which reviewers answer.
//!
//! `assess` only says whether a tool's calls must be asked about; it never decides *when* (the
//! scheduler presents a call only once it is unblocked) and never waits for anybody (an
//! [`Approver`] does, driven by the engine). The approvers in [`approver`] are the only part of
//! this module that touches tokio.

pub mod approver;

use std::collections::BTreeSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::protocol::Decision;
use crate::protocol::{Tool, ToolApproval};
pub use approver::{
    ApprovalRequest, Approver, ChannelApprover, PendingApproval, Scripted, ScriptedApprover, after,
};

/// Which calls are asked about.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Mode {
    /// Run everything without asking.
    #[default]
    Auto,
    /// Listed tools run; every other tool asks.
    Allowlist {
        /// Tool names that run without asking.
        allow: BTreeSet<String>,
    },
    /// Ask about every call.
    Ask,
}

/// What happens when a reviewer does not answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum DefaultDecision {
    /// Run the call as presented.
    Approve,
    /// Reject the call (the safe default).
    #[default]
    Reject,
}

/// An approval policy, as written in a goal file's `approval` field:
/// `{"policy": "allowlist", "allow": ["a", "b"], "timeout_s": 30, "default_decision": "reject"}`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "PolicyRepr", into = "PolicyRepr")]
pub struct Policy {
    /// Which calls are asked about.
    pub mode: Mode,
    /// How long a reviewer may take; None waits forever.
    pub timeout: Option<Duration>,
    /// Applied when the reviewer times out.
    pub default_decision: DefaultDecision,
}

impl Policy {
    /// `auto`: run everything.
    pub fn auto() -> Self {
        Policy::default()
    }

    /// `ask`: every call is presented.
    pub fn ask() -> Self {
        Policy {
            mode: Mode::Ask,
            ..Policy::default()
        }
    }

    /// `allowlist`: the named tools run, the others ask.
    pub fn allowlist<I: IntoIterator<Item = S>, S: Into<String>>(allow: I) -> Self {
        Policy {
            mode: Mode::Allowlist {
                allow: allow.into_iter().map(Into::into).collect(),
            },
            ..Policy::default()
        }
    }

    /// Sets the reviewer timeout and what applies when it expires (builder style).
    pub fn with_timeout(mut self, timeout: Duration, default: DefaultDecision) -> Self {
        self.timeout = Some(timeout);
        self.default_decision = default;
        self
    }
}

/// What the gate says about a tool's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Gate {
    /// Run as soon as unblocked.
    Run,
    /// Present to a reviewer first.
    Ask,
}

/// Rule 14: the per-tool `_approval` override wins; otherwise the policy's mode decides.
pub fn assess(tool: &Tool, policy: &Policy) -> Gate {
    match tool.approval {
        Some(ToolApproval::Always) => return Gate::Ask,
        Some(ToolApproval::Never) => return Gate::Run,
        None => {}
    }
    match &policy.mode {
        Mode::Auto => Gate::Run,
        Mode::Ask => Gate::Ask,
        Mode::Allowlist { allow } if allow.contains(&tool.name) => Gate::Run,
        Mode::Allowlist { .. } => Gate::Ask,
    }
}

/// A policy that cannot be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ApprovalError {
    /// `allow` given with a policy other than `allowlist`.
    #[error("`allow` only applies to the `allowlist` policy, not `{policy}`")]
    AllowWithoutAllowlist {
        /// The policy that was given.
        policy: String,
    },
    /// `timeout_s` negative, not finite or above `duration::MAX_SECONDS`.
    #[error(
        "`approval.timeout_s` must be a non-negative number of seconds no larger than {max} (one year), found {shown}",
        max = crate::duration::MAX_SECONDS,
        shown = crate::duration::show(*.value)
    )]
    BadTimeout {
        /// The value as given.
        value: f64,
    },
}

impl ApprovalError {
    /// A stable code for programs that react to failures.
    pub fn code(&self) -> &'static str {
        match self {
            ApprovalError::AllowWithoutAllowlist { .. } => "approval.allow_without_allowlist",
            ApprovalError::BadTimeout { .. } => "approval.bad_timeout",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ModeName {
    #[default]
    Auto,
    Allowlist,
    Ask,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyRepr {
    #[serde(default)]
    policy: ModeName,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    allow: Option<BTreeSet<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timeout_s: Option<f64>,
    #[serde(default)]
    default_decision: DefaultDecision,
}

impl TryFrom<PolicyRepr> for Policy {
    type Error = ApprovalError;

    fn try_from(r: PolicyRepr) -> Result<Self, Self::Error> {
        let mode = match (r.policy, r.allow) {
            (ModeName::Allowlist, allow) => Mode::Allowlist {
                allow: allow.unwrap_or_default(),
            },
            (other, Some(_)) => {
                let policy = if other == ModeName::Ask {
                    "ask"
                } else {
                    "auto"
                };
                return Err(ApprovalError::AllowWithoutAllowlist {
                    policy: policy.into(),
                });
            }
            (ModeName::Auto, None) => Mode::Auto,
            (ModeName::Ask, None) => Mode::Ask,
        };
        let timeout = match r.timeout_s {
            None => None,
            Some(value) => Some(
                crate::duration::seconds("approval.timeout_s", value)
                    .map_err(|_| ApprovalError::BadTimeout { value })?,
            ),
        };
        Ok(Policy {
            mode,
            timeout,
            default_decision: r.default_decision,
        })
    }
}

impl From<Policy> for PolicyRepr {
    fn from(p: Policy) -> Self {
        let (policy, allow) = match p.mode {
            Mode::Auto => (ModeName::Auto, None),
            Mode::Ask => (ModeName::Ask, None),
            Mode::Allowlist { allow } => (ModeName::Allowlist, Some(allow)),
        };
        PolicyRepr {
            policy,
            allow,
            timeout_s: p.timeout.map(|d| d.as_secs_f64()),
            default_decision: p.default_decision,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str, approval: Option<ToolApproval>) -> Tool {
        let mut t = Tool::new(name);
        t.activity = Some("rust".into());
        t.approval = approval;
        t
    }

    #[test]
    fn modes_decide_without_overrides() {
        let t = tool("issueRefund", None);
        assert_eq!(assess(&t, &Policy::auto()), Gate::Run);
        assert_eq!(assess(&t, &Policy::ask()), Gate::Ask);
        assert_eq!(assess(&t, &Policy::allowlist(["issueRefund"])), Gate::Run);
        assert_eq!(assess(&t, &Policy::allowlist(["other"])), Gate::Ask);
    }

    #[test]
    fn tool_override_beats_every_mode() {
        let always = tool("wire", Some(ToolApproval::Always));
        let never = tool("read", Some(ToolApproval::Never));
        for p in [
            Policy::auto(),
            Policy::ask(),
            Policy::allowlist(["wire", "read"]),
        ] {
            assert_eq!(assess(&always, &p), Gate::Ask, "{p:?}");
            assert_eq!(assess(&never, &p), Gate::Run, "{p:?}");
        }
    }

    #[test]
    fn goal_file_shape_parses_and_round_trips() {
        let p: Policy = serde_json::from_value(
            json!({"policy": "allowlist", "allow": ["checkBillingHistory"]}),
        )
        .expect("policy");
        assert_eq!(p, Policy::allowlist(["checkBillingHistory"]));
        let p: Policy = serde_json::from_value(
            json!({"policy": "ask", "timeout_s": 1.5, "default_decision": "approve"}),
        )
        .expect("policy");
        assert_eq!(
            p,
            Policy::ask().with_timeout(Duration::from_millis(1500), DefaultDecision::Approve)
        );
        let back: Policy =
            serde_json::from_value(serde_json::to_value(&p).expect("json")).expect("policy");
        assert_eq!(back, p);
        let empty: Policy = serde_json::from_value(json!({})).expect("policy");
        assert_eq!(empty, Policy::auto());
    }

    #[test]
    fn bad_policies_are_refused_with_codes() {
        let e = serde_json::from_value::<Policy>(json!({"policy": "ask", "allow": ["x"]}))
            .expect_err("allow with ask");
        assert!(
            e.to_string().contains("only applies to the `allowlist`"),
            "{e}"
        );
        let e = serde_json::from_value::<Policy>(json!({"policy": "sometimes"}))
            .expect_err("unknown mode");
        assert!(e.to_string().contains("sometimes"), "{e}");
        let e = serde_json::from_value::<Policy>(json!({"timeout_s": -1}))
            .expect_err("negative timeout");
        assert!(e.to_string().contains("non-negative"), "{e}");
        assert_eq!(
            ApprovalError::BadTimeout { value: -1.0 }.code(),
            "approval.bad_timeout"
        );
    }
}
