//! The operator's approval floor (DESIGN.md section 3.3): what the operator of `dagloop serve`
//! or `dagloop worker` says must be asked about, whatever a goal or a client asks.
//!
//! A [`Floor`] is a list of [`Layer`]s, each the operator's: server-wide (`[approval]` of the
//! config), per published agent (its entry's `approval`, and the agent's own goal policy, which
//! no client wrote), per MCP server and tool (an operator server's `approval = {tool =
//! "always"}`), and per tool kind (`[approval] kinds = {http = "ask"}`). The gate takes the
//! strictest of the floor's verdict and the goal's (deny over ask over allow), so nothing a
//! client sends (`approve`, a goal's rules, its `_approval` overrides, an MCP approval map) lowers
//! what the floor asks. A floor layer never reads the `_approval` of a tool a client could
//! have written: only the agent's own goal (the operator's file) is evaluated with its tools'
//! overrides.
//!
//! Timeouts: the reviewer the floor asks for gets to decide. A call the floor asks about waits
//! for the floor's deadline, not the goal's ([`Floor::on_timeout`]): the earliest `timeout_s` of
//! the layers that asked (none: it waits until a reviewer answers), so a client's `timeout_s:
//! 0.01` neither runs the call nor dismisses it before a reviewer could look. What applies when
//! that deadline passes is the strictest of the asking layers' defaults and the goal's: `approve`
//! only when every one of them says `approve`, else `reject`. The operator can thus let its own
//! timeout approve; nothing a client sends can.
//!
//! Pure and deterministic: no IO, no clock. The floor is recorded with the run (its stored
//! options), so a replay or a resume applies the same floor.
//! Deliberately not here: reading the operator's config (`crate::config`), who may decide a
//! call (the server's roles and its separation of duties).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::rules::{Source, Verdict, shorthand_verdict, strictness};
use super::{DefaultDecision, Mode, Policy, RuleDecision};
use crate::protocol::{Call, Tool};

/// One layer of the operator's floor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "layer", rename_all = "snake_case")]
pub enum Layer {
    /// `[approval]` of the config: a policy (mode, allowlist, rules) for every run.
    Server {
        /// The operator's policy (its timeout and default apply to calls it asks about).
        policy: Policy,
    },
    /// A published agent's: its config entry's `approval`, or (`goal: true`) the policy of the
    /// agent's goal file, which is the operator's too.
    Agent {
        /// The agent's name.
        agent: String,
        /// The policy.
        policy: Policy,
        /// The policy is the agent goal's own (its tools' `_approval` count, the goal being
        /// the operator's file).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        goal: bool,
    },
    /// An operator MCP server's tool that always asks (`*`: every tool of the server).
    McpTool {
        /// The server, by the operator's name.
        server: String,
        /// The MCP tool's name, or `*`.
        tool: String,
    },
    /// Every tool of an activity kind (`http`, `mcp`, `shell`, `delegate`, `rust`).
    Kind {
        /// The kind.
        kind: String,
        /// `ask` or `deny`.
        decision: RuleDecision,
    },
}

impl Layer {
    /// The layer's label in verdicts and the audit (`floor:server`, `floor:agent:NAME`,
    /// `floor:agent:NAME:goal`, `floor:mcp:SERVER:TOOL`, `floor:kind:KIND`).
    pub fn label(&self) -> String {
        match self {
            Layer::Server { .. } => "floor:server".into(),
            Layer::Agent {
                agent, goal: true, ..
            } => format!("floor:agent:{agent}:goal"),
            Layer::Agent { agent, .. } => format!("floor:agent:{agent}"),
            Layer::McpTool { server, tool } => format!("floor:mcp:{server}:{tool}"),
            Layer::Kind { kind, .. } => format!("floor:kind:{kind}"),
        }
    }

    /// The layer in words (`dagloop policy explain`).
    pub fn describe(&self) -> String {
        match self {
            Layer::Server { .. } => "the operator's floor (server-wide)".into(),
            Layer::Agent {
                agent, goal: true, ..
            } => format!("the operator's floor (agent `{agent}`, its goal's policy)"),
            Layer::Agent { agent, .. } => format!("the operator's floor (agent `{agent}`)"),
            Layer::McpTool { server, tool } if tool == "*" => {
                format!("the operator's floor (every tool of MCP server `{server}`)")
            }
            Layer::McpTool { server, tool } => {
                format!("the operator's floor (MCP server `{server}`, tool `{tool}`)")
            }
            Layer::Kind { kind, .. } => format!("the operator's floor (tool kind `{kind}`)"),
        }
    }

    /// The policy the layer holds, if it is one.
    fn policy(&self) -> Option<&Policy> {
        match self {
            Layer::Server { policy } | Layer::Agent { policy, .. } => Some(policy),
            _ => None,
        }
    }

    /// What the layer says about a call of `tool`, and how it decided (`None` for a layer that
    /// is not a policy).
    fn verdict(&self, tool: &Tool, call: &Call) -> Option<(RuleDecision, Option<Source>)> {
        match self {
            Layer::Server { policy }
            | Layer::Agent {
                policy,
                goal: false,
                ..
            } => {
                let v = shorthand_verdict(tool, call, policy, false);
                Some((v.decision, Some(v.source)))
            }
            Layer::Agent {
                policy, goal: true, ..
            } => {
                let v = shorthand_verdict(tool, call, policy, true);
                Some((v.decision, Some(v.source)))
            }
            Layer::McpTool { server, tool: name } => {
                let mcp = tool.schema.get("_mcp")?;
                let on = mcp.get("server").and_then(serde_json::Value::as_str) == Some(server);
                let named = name == "*"
                    || mcp.get("tool").and_then(serde_json::Value::as_str) == Some(name);
                (on && named).then_some((RuleDecision::Ask, None))
            }
            Layer::Kind { kind, decision } => {
                (tool.kind() == Some(kind.as_str())).then_some((*decision, None))
            }
        }
    }

    /// The deadline and default of a call this layer asks about.
    fn timeout(&self, floor: &Floor) -> (Option<Duration>, DefaultDecision) {
        match self {
            Layer::Server { policy } | Layer::Agent { policy, .. } => {
                (policy.timeout, policy.default_decision)
            }
            _ => (
                floor.timeout_ms.map(Duration::from_millis),
                floor.default_decision,
            ),
        }
    }
}

/// The operator's floor in force in a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Floor {
    /// The layers, in the order they are reported.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<Layer>,
    /// How long a reviewer may take on a call an MCP-tool or kind layer asks about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// What applies then (`reject` unless the operator says otherwise).
    #[serde(default)]
    pub default_decision: DefaultDecision,
}

impl Floor {
    /// No layer: the goal's policy alone decides.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// The strictest layer's verdict about a call (the first such layer), or None when every
    /// layer allows it.
    pub fn verdict(&self, tool: &Tool, call: &Call) -> Option<Verdict> {
        let mut best: Option<Verdict> = None;
        for (i, layer) in self.layers.iter().enumerate() {
            let Some((decision, within)) = layer.verdict(tool, call) else {
                continue;
            };
            if decision == RuleDecision::Allow {
                continue;
            }
            if best.is_none_or(|b| strictness(decision) > strictness(b.decision)) {
                best = Some(Verdict {
                    decision,
                    source: Source::Floor {
                        layer: i,
                        within: within.map(Within::from),
                    },
                });
            }
        }
        best
    }

    /// The layer `i`.
    pub fn layer(&self, i: usize) -> Option<&Layer> {
        self.layers.get(i)
    }

    /// The reviewer deadline of a call presented under `goal` (the goal's or client's policy)
    /// and what applies when it passes (see the module's doc).
    pub fn on_timeout(
        &self,
        goal: &Policy,
        tool: &Tool,
        call: &Call,
    ) -> (Option<Duration>, DefaultDecision) {
        let asking: Vec<&Layer> = self
            .layers
            .iter()
            .filter(|l| {
                l.verdict(tool, call)
                    .is_some_and(|(d, _)| d == RuleDecision::Ask)
            })
            .collect();
        if asking.is_empty() {
            return (goal.timeout, goal.default_decision);
        }
        let mut deadline: Option<Duration> = None;
        let mut approve = goal.default_decision == DefaultDecision::Approve;
        for l in &asking {
            let (t, d) = l.timeout(self);
            deadline = earlier(deadline, t);
            approve &= d == DefaultDecision::Approve;
        }
        let default = if approve {
            DefaultDecision::Approve
        } else {
            DefaultDecision::Reject
        };
        (deadline, default)
    }

    /// Why some call of a run may be presented because of the floor (`tools`: every tool the
    /// run can call), or None.
    pub fn who_asks<'a>(&self, tools: impl IntoIterator<Item = &'a Tool>) -> Option<String> {
        let tools: Vec<&Tool> = tools.into_iter().collect();
        let mut names = BTreeSet::new();
        for layer in &self.layers {
            let asks = match layer.policy() {
                Some(p) => {
                    p.mode != Mode::Auto
                        || p.rules.iter().any(|r| r.spec.decision == RuleDecision::Ask)
                        || matches!(layer, Layer::Agent { goal: true, .. })
                            && super::who_asks(p, tools.iter().copied()).is_some()
                }
                None => tools.iter().any(|t| {
                    layer
                        .verdict(t, &Call::new(t.name.clone()))
                        .is_some_and(|(d, _)| d == RuleDecision::Ask)
                }),
            };
            if asks {
                names.insert(layer.label());
            }
        }
        (!names.is_empty()).then(|| {
            format!(
                "the operator's floor: {}",
                names.into_iter().collect::<Vec<_>>().join(", ")
            )
        })
    }
}

/// The earlier of two deadlines (None: no deadline).
fn earlier(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// What decided inside a floor layer that is a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Within {
    /// The layer policy's rule at this index.
    Rule(usize),
    /// The tool's `_approval` (an agent goal's own tools only).
    ToolOverride,
    /// The layer policy's mode.
    Mode,
}

impl From<Source> for Within {
    fn from(s: Source) -> Within {
        match s {
            Source::Rule(i) => Within::Rule(i),
            Source::ToolOverride => Within::ToolOverride,
            _ => Within::Mode,
        }
    }
}

impl Within {
    /// The deciding rule inside the layer: a rule's label, `_approval`, `policy:MODE`.
    pub(crate) fn label(self, policy: &Policy) -> String {
        match self {
            Within::Rule(i) => policy
                .rules
                .get(i)
                .map_or_else(|| format!("rules[{i}]"), |r| r.label.clone()),
            Within::ToolOverride => "_approval".into(),
            Within::Mode => format!("policy:{}", policy.mode.name()),
        }
    }

    /// The same, as a source of the layer's policy.
    pub(crate) fn source(self) -> Source {
        match self {
            Within::Rule(i) => Source::Rule(i),
            Within::ToolOverride => Source::ToolOverride,
            Within::Mode => Source::Mode,
        }
    }
}

/// The operator's floor for every run of a process, as its config says, before it is narrowed
/// to one run ([`OperatorFloor::for_run`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperatorFloor {
    /// `[approval]`: the server-wide policy (None: no server-wide layer).
    pub server: Option<Policy>,
    /// `[approval] kinds`: tool kinds and what the floor says of their calls.
    pub kinds: BTreeMap<String, RuleDecision>,
    /// The operator's MCP servers' tools that always ask (`*`: every tool), by server.
    pub mcp: BTreeMap<String, BTreeSet<String>>,
    /// `[agents.NAME] approval`.
    pub agents: BTreeMap<String, Policy>,
    /// `[approval] timeout_s` and `default_decision`, for the MCP-tool and kind layers.
    pub timeout: Option<Duration>,
    /// See [`OperatorFloor::timeout`].
    pub default_decision: DefaultDecision,
}

impl OperatorFloor {
    /// The floor of one run: of the published agent `agent` (with its goal's policy) when the
    /// run is one, else of a submitted goal. None when the operator sets no floor at all.
    pub fn for_run(&self, agent: Option<(&str, Option<&Policy>)>) -> Option<Floor> {
        let mut layers = Vec::new();
        if let Some(p) = &self.server {
            layers.push(Layer::Server { policy: p.clone() });
        }
        if let Some((name, goal)) = agent {
            if let Some(p) = self.agents.get(name) {
                layers.push(Layer::Agent {
                    agent: name.to_string(),
                    policy: p.clone(),
                    goal: false,
                });
            }
            if let Some(p) = goal {
                layers.push(Layer::Agent {
                    agent: name.to_string(),
                    policy: p.clone(),
                    goal: true,
                });
            }
        }
        for (server, tools) in &self.mcp {
            for tool in tools {
                layers.push(Layer::McpTool {
                    server: server.clone(),
                    tool: tool.clone(),
                });
            }
        }
        for (kind, decision) in &self.kinds {
            layers.push(Layer::Kind {
                kind: kind.clone(),
                decision: *decision,
            });
        }
        (!layers.is_empty()).then(|| Floor {
            layers,
            timeout_ms: self
                .timeout
                .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            default_decision: self.default_decision,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::approval::{ModeName, evaluate};
    use crate::protocol::ToolApproval;
    use serde_json::json;

    fn mcp_tool(server: &str, name: &str, approval: Option<ToolApproval>) -> Tool {
        let mut t = Tool::new(name);
        t.activity = Some("mcp".into());
        t.approval = approval;
        t.schema
            .insert("_mcp".into(), json!({"server": server, "tool": name}));
        t
    }

    fn policy(v: serde_json::Value) -> Policy {
        Policy::from_value(&v).expect("policy")
    }

    fn with_floor(mut p: Policy, floor: Floor) -> Policy {
        p.floor = floor;
        p
    }

    fn mcp_floor() -> Floor {
        OperatorFloor {
            mcp: [("billing".to_string(), ["delete_all".to_string()].into())].into(),
            ..OperatorFloor::default()
        }
        .for_run(None)
        .expect("a floor")
    }

    /// The three ways a goal lowered an operator's `always`: none of them does.
    #[test]
    fn nothing_a_goal_says_lowers_an_mcp_tool_floor() {
        let tool = mcp_tool("billing", "delete_all", Some(ToolApproval::Never));
        let call = Call::new("delete_all");
        for goal in [
            Policy::auto(),
            policy(json!({"rules": [{"tool": "*", "decision": "allow"}]})),
            policy(json!({"policy": "ask", "timeout_s": 0.01, "default_decision": "approve"})),
            Policy::ask().with_mode(ModeName::Auto),
        ] {
            let p = with_floor(goal, mcp_floor());
            let v = evaluate(&tool, &call, &p);
            assert_eq!(v.decision, RuleDecision::Ask, "{p:?}");
            assert_eq!(v.label(&p), "floor:mcp:billing:delete_all");
            assert_eq!(
                p.floor.on_timeout(&p, &tool, &call).1,
                DefaultDecision::Reject
            );
        }
        // Another tool of the server is the goal's to decide.
        let other = mcp_tool("billing", "list", None);
        let p = with_floor(Policy::auto(), mcp_floor());
        assert_eq!(
            evaluate(&other, &Call::new("list"), &p).decision,
            RuleDecision::Allow
        );
    }

    /// A goal's `deny` is stricter than the floor's `ask` and stands.
    #[test]
    fn the_strictest_wins_either_way() {
        let tool = mcp_tool("billing", "delete_all", None);
        let call = Call::new("delete_all");
        let p = with_floor(
            policy(json!({"rules": [{"tool": "delete_*", "decision": "deny"}]})),
            mcp_floor(),
        );
        let v = evaluate(&tool, &call, &p);
        assert_eq!(
            (v.decision, v.label(&p).as_str()),
            (RuleDecision::Deny, "rules[0]")
        );
        let kind = OperatorFloor {
            kinds: [("mcp".to_string(), RuleDecision::Deny)].into(),
            ..OperatorFloor::default()
        }
        .for_run(None)
        .expect("floor");
        let p = with_floor(Policy::ask(), kind);
        let v = evaluate(&tool, &call, &p);
        assert_eq!(
            (v.decision, v.label(&p).as_str()),
            (RuleDecision::Deny, "floor:kind:mcp")
        );
    }

    /// The server-wide floor never reads a tool's `_approval` (a client may have written it); an
    /// agent's own goal does (the operator wrote it).
    #[test]
    fn only_the_agent_goal_layer_reads_tool_overrides() {
        let mut t = Tool::new("refund");
        t.activity = Some("http".into());
        t.approval = Some(ToolApproval::Never);
        let call = Call::new("refund");
        let server = OperatorFloor {
            server: Some(Policy::ask()),
            ..OperatorFloor::default()
        }
        .for_run(None)
        .expect("floor");
        let p = with_floor(Policy::auto(), server);
        assert_eq!(evaluate(&t, &call, &p).label(&p), "floor:server/policy:ask");
        let agent = OperatorFloor::default()
            .for_run(Some(("refunds", Some(&Policy::ask()))))
            .expect("floor");
        let p = with_floor(Policy::auto(), agent.clone());
        assert_eq!(evaluate(&t, &call, &p).decision, RuleDecision::Allow);
        t.approval = None;
        let v = evaluate(&t, &call, &p);
        assert_eq!(
            (v.decision, v.label(&p).as_str()),
            (RuleDecision::Ask, "floor:agent:refunds:goal/policy:ask")
        );
    }

    /// Timeouts: a floor-asked call waits for the floor's deadline (none: a reviewer), and is
    /// approved then only when every asking layer and the goal approve by default.
    #[test]
    fn a_timeout_never_approves_what_the_floor_asks_unless_the_operator_says_so() {
        let tool = mcp_tool("billing", "delete_all", None);
        let call = Call::new("delete_all");
        let quick = Policy::ask().with_timeout(Duration::from_millis(10), DefaultDecision::Approve);
        let mut floor = mcp_floor();
        assert_eq!(
            floor.on_timeout(&quick, &tool, &call),
            (None, DefaultDecision::Reject)
        );
        floor.timeout_ms = Some(60_000);
        floor.default_decision = DefaultDecision::Approve;
        assert_eq!(
            floor.on_timeout(&quick, &tool, &call),
            (Some(Duration::from_secs(60)), DefaultDecision::Approve)
        );
        let strict = Policy::ask().with_timeout(Duration::from_millis(10), DefaultDecision::Reject);
        assert_eq!(
            floor.on_timeout(&strict, &tool, &call),
            (Some(Duration::from_secs(60)), DefaultDecision::Reject)
        );
        // A call the floor does not ask about keeps the goal's.
        let other = mcp_tool("billing", "list", None);
        assert_eq!(
            floor.on_timeout(&quick, &other, &Call::new("list")),
            (Some(Duration::from_millis(10)), DefaultDecision::Approve)
        );
    }

    #[test]
    fn floors_round_trip_as_stored() {
        let f = OperatorFloor {
            server: Some(policy(
                json!({"rules": [{"tool": "wire", "decision": "ask"}]}),
            )),
            kinds: [("shell".to_string(), RuleDecision::Deny)].into(),
            ..OperatorFloor::default()
        }
        .for_run(Some(("a", Some(&Policy::ask()))))
        .expect("floor");
        let v = serde_json::to_value(&f).expect("json");
        let back: Floor = serde_json::from_value(v).expect("floor");
        assert_eq!(back, f);
        assert!(OperatorFloor::default().for_run(None).is_none());
        assert!(f.who_asks([]).is_some());
    }
}
