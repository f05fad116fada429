//! The approval gate (rules 13 and 14): policies as data, a pure [`assess`], the operator's
//! [`floor`] under every policy, and the [`Approver`] seam through which reviewers answer.
//!
//! `assess` only says whether a tool's calls must be asked about; it never decides *when* (the
//! scheduler presents a call only once it is unblocked) and never waits for anybody (an
//! [`Approver`] does, driven by the engine). The approvers in [`approver`] are the only part of
//! this module that touches tokio.

pub mod approver;
pub mod floor;
pub mod rules;
pub mod standing;

use std::collections::BTreeSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::protocol::Decision;
use crate::protocol::{Tool, ToolApproval};
pub use approver::{
    ApprovalRequest, Approver, ChannelApprover, PendingApproval, Scripted, ScriptedApprover, after,
};
pub use floor::{Floor, Layer, OperatorFloor};
pub use rules::{
    Explanation, Rule, RuleDecision, RuleSpec, Source, Verdict, call_subject, evaluate, explain,
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

impl Mode {
    /// The mode's name (`auto`, `allowlist`, `ask`).
    pub fn name(&self) -> ModeName {
        match self {
            Mode::Auto => ModeName::Auto,
            Mode::Allowlist { .. } => ModeName::Allowlist,
            Mode::Ask => ModeName::Ask,
        }
    }
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
    /// Ordered rules tried before the tool's `_approval` and the mode (first match wins).
    pub rules: Vec<Rule>,
    /// The operator's floor under the policy: the gate takes the strictest of the two
    /// ([`evaluate`]). Never part of a goal's `approval`; a run records it in its options.
    pub floor: Floor,
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

    /// The policy with its mode named by `name` instead (a run's `--approve` over the goal's
    /// policy): `allowlist` keeps the goal's allowed tools when the goal's policy is already an
    /// allowlist; the timeout and default decision stay.
    pub fn with_mode(mut self, name: ModeName) -> Self {
        self.mode = match (name, self.mode) {
            (ModeName::Auto, _) => Mode::Auto,
            (ModeName::Ask, _) => Mode::Ask,
            (ModeName::Allowlist, Mode::Allowlist { allow }) => Mode::Allowlist { allow },
            (ModeName::Allowlist, _) => Mode::Allowlist {
                allow: BTreeSet::new(),
            },
        };
        self
    }

    /// The policy with the operator's `floor` under it (builder style).
    pub fn with_floor(mut self, floor: Floor) -> Self {
        self.floor = floor;
        self
    }

    /// The reviewer deadline of a call presented under this policy and what applies when it
    /// passes: the goal's, or for a call the floor asks about the floor's ([`Floor::on_timeout`]).
    pub fn on_timeout(
        &self,
        tool: &Tool,
        call: &crate::protocol::Call,
    ) -> (Option<Duration>, DefaultDecision) {
        if self.floor.is_empty() {
            return (self.timeout, self.default_decision);
        }
        self.floor.on_timeout(self, tool, call)
    }

    /// Sets the reviewer timeout and what applies when it expires (builder style).
    pub fn with_timeout(mut self, timeout: Duration, default: DefaultDecision) -> Self {
        self.timeout = Some(timeout);
        self.default_decision = default;
        self
    }

    /// Reads a policy as written in a goal (`approval`), keeping the typed error (a rule whose
    /// example fails is `approval.rule_example`, naming the rule and the example).
    pub fn from_value(v: &serde_json::Value) -> Result<Policy, ApprovalError> {
        let repr: PolicyRepr =
            serde_json::from_value(v.clone()).map_err(|e| ApprovalError::Malformed {
                reason: e.to_string(),
            })?;
        Policy::try_from(repr)
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

/// Rule 14 for the old forms only (the rules need the call: [`evaluate`]): the per-tool
/// `_approval` override wins; otherwise the policy's mode decides.
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

/// True when some call of a run under `policy` may have to be presented to a reviewer: the
/// policy is not `auto` (a reviewer's replacement may name any tool), or some tool the run can
/// call asks whatever the policy (`_approval: "always"`, an MCP tool whose annotations call for
/// a reviewer, e.g. `destructiveHint: true`). `tools` must be every tool the run can call: the
/// goal's, its MCP servers' and its delegates' (nested agents share the run's reviewer). The one
/// answer to "can this run ask a reviewer?": the builder refuses to start such a run without
/// one, and the command line decides from it whether it needs a terminal.
pub fn may_ask<'a>(policy: &Policy, tools: impl IntoIterator<Item = &'a Tool>) -> bool {
    who_asks(policy, tools).is_some()
}

/// [`may_ask`], saying why: `the ask policy`, or `tools that always ask: a, b`; None when no
/// call of the run can be presented.
pub fn who_asks<'a>(policy: &Policy, tools: impl IntoIterator<Item = &'a Tool>) -> Option<String> {
    let tools: Vec<&Tool> = tools.into_iter().collect();
    if let Some(floor) = policy.floor.who_asks(tools.iter().copied()) {
        return Some(floor);
    }
    if policy.mode != Mode::Auto {
        return Some(format!("the {} policy", policy.mode.name()));
    }
    if let Some(r) = policy
        .rules
        .iter()
        .find(|r| r.spec.decision == RuleDecision::Ask)
    {
        return Some(format!("the rule {} asks", r.label));
    }
    let mut names: Vec<&str> = tools
        .into_iter()
        .filter(|t| assess(t, policy) == Gate::Ask)
        .map(|t| t.name.as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    (!names.is_empty()).then(|| format!("tools that always ask: {}", names.join(", ")))
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
    /// A policy name that is not `auto`, `allowlist` or `ask`.
    #[error("unknown approval policy `{mode}` (expected auto, allowlist or ask)")]
    BadMode {
        /// The name as given.
        mode: String,
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
    /// A rule that cannot be used (`when` is not a schema, an example is not a call...).
    #[error("approval rule {rule}: {reason}")]
    BadRule {
        /// The rule's name or `rules[i]`.
        rule: String,
        /// What is wrong.
        reason: String,
    },
    /// A rule's example does not come out as its author said.
    #[error("approval rule {rule}: {example} {}", if *.expected { "must match the rule but does not" } else { "must not match the rule but does" })]
    RuleExample {
        /// The rule's name or `rules[i]`.
        rule: String,
        /// Which example (`examples.match[0]`).
        example: String,
        /// Whether the example was meant to match.
        expected: bool,
    },
    /// The policy is not the expected shape.
    #[error("{reason}")]
    Malformed {
        /// The deserializer's explanation.
        reason: String,
    },
}

crate::codes::has_code!(ApprovalError);

impl ApprovalError {
    /// A stable code for programs that react to failures.
    pub fn code(&self) -> &'static str {
        match self {
            ApprovalError::AllowWithoutAllowlist { .. } => "approval.allow_without_allowlist",
            ApprovalError::BadTimeout { .. } => "approval.bad_timeout",
            ApprovalError::BadMode { .. } => "approval.bad_mode",
            ApprovalError::BadRule { .. } => "approval.bad_rule",
            ApprovalError::RuleExample { .. } => "approval.rule_example",
            ApprovalError::Malformed { .. } => "approval.malformed",
        }
    }
}

/// A policy's name, as written in a goal's `approval.policy` and in a run's options
/// (`--approve auto|allowlist|ask`, the server's `approve`): `auto`, `allowlist` or `ask`.
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModeName {
    /// Run everything without asking.
    #[default]
    Auto,
    /// Listed tools run; every other tool asks.
    Allowlist,
    /// Ask about every call.
    Ask,
}

impl ModeName {
    /// Every name, in order.
    pub const ALL: [ModeName; 3] = [ModeName::Auto, ModeName::Allowlist, ModeName::Ask];

    /// The name as written.
    pub fn as_str(self) -> &'static str {
        match self {
            ModeName::Auto => "auto",
            ModeName::Allowlist => "allowlist",
            ModeName::Ask => "ask",
        }
    }

    /// Reads a name; anything else is `approval.bad_mode`.
    pub fn parse(s: &str) -> Result<ModeName, ApprovalError> {
        ModeName::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| ApprovalError::BadMode {
                mode: s.to_string(),
            })
    }
}

impl std::fmt::Display for ModeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
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
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    rules: Vec<RuleSpec>,
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
        let rules = r
            .rules
            .into_iter()
            .enumerate()
            .map(|(i, spec)| Rule::compile(i, spec))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Policy {
            mode,
            timeout,
            default_decision: r.default_decision,
            rules,
            floor: Floor::default(),
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
            rules: p.rules.into_iter().map(|r| r.spec).collect(),
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

    #[test]
    fn names_override_the_goal_policy_and_unknown_names_are_refused() {
        assert_eq!(ModeName::parse("ask"), Ok(ModeName::Ask));
        let e = ModeName::parse("sometimes").unwrap_err();
        assert_eq!(e.code(), "approval.bad_mode");
        assert_eq!(
            serde_json::to_value(ModeName::Allowlist).unwrap(),
            json!("allowlist")
        );
        let goal =
            Policy::allowlist(["a"]).with_timeout(Duration::from_secs(3), DefaultDecision::Approve);
        assert_eq!(goal.clone().with_mode(ModeName::Allowlist), goal);
        let ask = goal.clone().with_mode(ModeName::Ask);
        assert_eq!(
            (ask.mode, ask.timeout),
            (Mode::Ask, Some(Duration::from_secs(3)))
        );
        assert_eq!(
            Policy::ask().with_mode(ModeName::Allowlist).mode,
            Mode::Allowlist {
                allow: BTreeSet::new()
            }
        );
    }

    #[test]
    fn who_asks_names_the_policy_or_the_tools_that_always_ask() {
        let plain = tool("read", None);
        let always = tool("wire", Some(ToolApproval::Always));
        let never = tool("list", Some(ToolApproval::Never));
        assert_eq!(who_asks(&Policy::auto(), [&plain, &never]), None);
        assert!(!may_ask(&Policy::auto(), [&plain, &never]));
        assert_eq!(
            who_asks(&Policy::auto(), [&plain, &always, &always]).as_deref(),
            Some("tools that always ask: wire")
        );
        // A policy that asks can ask about any call, a replacement's included.
        assert_eq!(
            who_asks(&Policy::allowlist(["read"]), [&plain]).as_deref(),
            Some("the allowlist policy")
        );
        assert!(may_ask(&Policy::ask(), []));
    }
}
