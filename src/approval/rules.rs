//! Approval rules: an ordered list of `{tool: glob, when: JSON Schema, decision: allow|ask|deny,
//! reason}` where the first rule that matches a call decides it, and the old policy forms
//! (`_approval` on a tool, the `auto`/`allowlist`/`ask` modes) compiled to rules after them.
//!
//! A rule's `when` is checked against the call as the gate sees it: its resolved params (meta
//! keys left out) plus `_tool` (the tool's name) and `_annotations` (the tool's MCP annotations,
//! `{}` when it has none), so `{"properties": {"_annotations": {"properties": {"readOnlyHint":
//! {"const": true}}}}}` selects read-only MCP tools. A rule's `examples` (calls it must and must
//! not match) are checked when the policy is read, so a rule that does not say what its author
//! meant is refused before any run.
//!
//! Pure and deterministic: no IO, no clock; rules are tried in their written order.
//! Deliberately not here: presenting calls (the scheduler) or waiting for reviewers.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::floor::{Layer, Within};
use super::{ApprovalError, Mode, Policy};
use crate::protocol::{Call, Tool, ToolApproval};

/// What a rule decides about the calls it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleDecision {
    /// Run without asking.
    Allow,
    /// Present to a reviewer.
    Ask,
    /// Refuse without asking (the model is told the rule's reason).
    Deny,
}

impl RuleDecision {
    /// The decision as written.
    pub fn as_str(self) -> &'static str {
        match self {
            RuleDecision::Allow => "allow",
            RuleDecision::Ask => "ask",
            RuleDecision::Deny => "deny",
        }
    }
}

/// Calls a rule must and must not match, checked when the policy is read. Each example is a
/// call: `{"_tool": NAME, ...params}`, optionally with `_annotations`; `_tool` may be left out
/// when the rule's `tool` is a plain name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Examples {
    /// Calls the rule must match.
    #[serde(default, rename = "match", skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<Value>,
    /// Calls the rule must not match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_match: Vec<Value>,
}

/// One rule as written in `approval.rules`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// A name for the rule (shown by `policy explain` and in the audit); `rules[i]` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Which tools: a glob over the tool's name (`*` any run of characters, `?` one).
    pub tool: String,
    /// A JSON Schema the call must satisfy (see the module's doc for what it sees).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<Value>,
    /// What the rule decides.
    pub decision: RuleDecision,
    /// Why, in words (shown to reviewers and, for `deny`, to the model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Calls it must and must not match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub examples: Option<Examples>,
}

/// A rule ready to evaluate: its spec, its label and its compiled `when`.
#[derive(Clone)]
pub struct Rule {
    /// The rule as written.
    pub spec: RuleSpec,
    /// How the rule is named in explanations and the audit.
    pub label: String,
    when: Option<Arc<jsonschema::Validator>>,
}

impl std::fmt::Debug for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rule")
            .field("label", &self.label)
            .field("spec", &self.spec)
            .finish()
    }
}

impl PartialEq for Rule {
    fn eq(&self, other: &Self) -> bool {
        self.spec == other.spec && self.label == other.label
    }
}

impl Eq for Rule {}

impl Rule {
    /// Compiles the `index`th rule of a policy and checks its examples.
    pub fn compile(index: usize, spec: RuleSpec) -> Result<Rule, ApprovalError> {
        let label = spec
            .name
            .clone()
            .unwrap_or_else(|| format!("rules[{index}]"));
        let when = match &spec.when {
            None => None,
            Some(schema) => {
                Some(
                    compile_schema(schema).map_err(|reason| ApprovalError::BadRule {
                        rule: label.clone(),
                        reason: format!("`when` is not a valid JSON Schema: {reason}"),
                    })?,
                )
            }
        };
        if spec.tool.trim().is_empty() {
            return Err(ApprovalError::BadRule {
                rule: label,
                reason: "`tool` must name a tool or a glob".into(),
            });
        }
        let rule = Rule { spec, label, when };
        rule.check_examples()?;
        Ok(rule)
    }

    fn check_examples(&self) -> Result<(), ApprovalError> {
        let Some(ex) = &self.spec.examples else {
            return Ok(());
        };
        let cases = ex
            .matches
            .iter()
            .map(|e| (e, true, "match"))
            .chain(ex.not_match.iter().map(|e| (e, false, "not_match")));
        let mut counts = [0usize; 2];
        for (example, expected, list) in cases {
            let i = counts[usize::from(!expected)];
            counts[usize::from(!expected)] += 1;
            let at = format!("examples.{list}[{i}]");
            let (tool, subject) =
                self.example_subject(example)
                    .map_err(|reason| ApprovalError::BadRule {
                        rule: self.label.clone(),
                        reason: format!("{at}: {reason}"),
                    })?;
            if self.matches(&tool, &subject) != expected {
                return Err(ApprovalError::RuleExample {
                    rule: self.label.clone(),
                    example: at,
                    expected,
                });
            }
        }
        Ok(())
    }

    fn example_subject(&self, example: &Value) -> Result<(String, Value), String> {
        let obj = example
            .as_object()
            .ok_or("an example is a call (a JSON object)")?;
        let tool = match obj.get("_tool") {
            Some(Value::String(t)) => t.clone(),
            Some(_) => return Err("`_tool` must be a string".into()),
            None if !is_glob(&self.spec.tool) => self.spec.tool.clone(),
            None => return Err("give `_tool`: the rule's `tool` is a glob".into()),
        };
        let annotations = obj.get("_annotations").cloned();
        let params: Map<String, Value> = crate::protocol::without_meta(obj);
        Ok((tool.clone(), subject(&tool, &params, annotations)))
    }

    /// True when the rule applies to a call of `tool` seen as `subject` (see [`call_subject`]).
    pub fn matches(&self, tool: &str, subject: &Value) -> bool {
        glob(&self.spec.tool, tool) && self.when.as_ref().is_none_or(|v| v.is_valid(subject))
    }
}

/// Compiles a schema offline (nothing is fetched).
pub(crate) fn compile_schema(schema: &Value) -> Result<Arc<jsonschema::Validator>, String> {
    jsonschema::options()
        .offline()
        .build(schema)
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

fn is_glob(p: &str) -> bool {
    p.contains(['*', '?'])
}

/// `*` matches any run of characters (none included), `?` exactly one; everything else itself.
pub fn glob(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    // Iterative matching with one backtrack point for the last `*` (linear in practice).
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ni));
                pi += 1;
            }
            Some(c) if *c == '?' || *c == n[ni] => {
                pi += 1;
                ni += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    pi = sp + 1;
                    ni = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

fn subject(tool: &str, params: &Map<String, Value>, annotations: Option<Value>) -> Value {
    let mut m = params.clone();
    m.insert("_tool".into(), Value::String(tool.to_string()));
    m.insert(
        "_annotations".into(),
        annotations.unwrap_or_else(|| Value::Object(Map::new())),
    );
    Value::Object(m)
}

/// What a rule's `when` sees of a call: its params without meta keys, plus `_tool` and the
/// tool's MCP `_annotations`.
pub fn call_subject(tool: &Tool, call: &Call) -> Value {
    let params: Map<String, Value> = call.plain_params();
    subject(&call.tool, &params, tool.schema.get("annotations").cloned())
}

/// Which rule decided a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The policy's rule at this index.
    Rule(usize),
    /// The tool's own `_approval`.
    ToolOverride,
    /// The policy's mode (`auto`, `allowlist`, `ask`).
    Mode,
    /// A layer of the operator's floor (`policy.floor.layers[layer]`), and what decided inside
    /// it when it is a policy.
    Floor {
        /// The layer's index.
        layer: usize,
        /// The rule, override or mode of the layer's policy that decided.
        within: Option<Within>,
    },
}

/// What decided a call, cheaply (no allocation): the decision and the rule it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Allow, ask or deny.
    pub decision: RuleDecision,
    /// The deciding rule.
    pub source: Source,
}

impl Verdict {
    /// The deciding rule's label: a rule's name or `rules[i]`, `_approval` (the tool's own
    /// override), `policy:auto|allowlist|ask` (the policy's mode), or a floor layer's label
    /// (`floor:mcp:billing:delete_all`, `floor:server/rules[0]`: see [`Layer::label`]).
    pub fn label(&self, policy: &Policy) -> String {
        match self.source {
            Source::Floor { layer, within } => {
                let Some(l) = policy.floor.layer(layer) else {
                    return format!("floor[{layer}]");
                };
                match (within, l) {
                    (Some(w), Layer::Server { policy: p } | Layer::Agent { policy: p, .. }) => {
                        format!("{}/{}", l.label(), w.label(p))
                    }
                    _ => l.label(),
                }
            }
            Source::Rule(i) => policy
                .rules
                .get(i)
                .map_or_else(|| format!("rules[{i}]"), |r| r.label.clone()),
            Source::ToolOverride => "_approval".into(),
            Source::Mode => format!("policy:{}", policy.mode.name()),
        }
    }

    /// Why, in words: the rule's reason, or what the shorthand says.
    pub fn reason(&self, policy: &Policy, tool: &Tool) -> String {
        match self.source {
            Source::Floor { layer, within } => {
                let Some(l) = policy.floor.layer(layer) else {
                    return "the operator's floor".into();
                };
                let inner = match (within, l) {
                    (Some(w), Layer::Server { policy: p } | Layer::Agent { policy: p, .. }) => {
                        Verdict {
                            decision: self.decision,
                            source: w.source(),
                        }
                        .reason(p, tool)
                    }
                    _ if self.decision == RuleDecision::Deny => {
                        format!("every call of `{}` is refused", tool.name)
                    }
                    _ => format!("a reviewer decides every call of `{}`", tool.name),
                };
                format!("{}: {inner}", l.describe())
            }
            Source::Rule(i) => policy
                .rules
                .get(i)
                .and_then(|r| r.spec.reason.clone())
                .unwrap_or_else(|| {
                    format!(
                        "the approval rule {} says {}",
                        self.label(policy),
                        self.decision.as_str()
                    )
                }),
            Source::ToolOverride => format!(
                "the tool `{}` says `_approval: {}`",
                tool.name,
                if self.decision == RuleDecision::Ask {
                    "always"
                } else {
                    "never"
                }
            ),
            Source::Mode => match (&policy.mode, self.decision) {
                (Mode::Auto, _) => "the auto policy runs every call".into(),
                (Mode::Ask, _) => "the ask policy asks about every call".into(),
                (Mode::Allowlist { .. }, RuleDecision::Allow) => {
                    format!("`{}` is on the allowlist", tool.name)
                }
                (Mode::Allowlist { .. }, _) => {
                    format!("`{}` is not on the allowlist", tool.name)
                }
            },
        }
    }
}

/// How a call was decided, rule by rule (`dagloop policy explain`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Explanation {
    /// The decision.
    pub decision: RuleDecision,
    /// The deciding rule's label.
    pub rule: String,
    /// Why.
    pub reason: String,
    /// Which layer decided: `goal` (the goal's policy, with the run's `approve` over its mode),
    /// or the operator's floor: `floor:server`, `floor:agent`, `floor:mcp`, `floor:kind`.
    pub layer: String,
    /// What the goal's policy alone says, when the floor decided: `ask by policy:auto`... (None
    /// when the goal decided).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goal: Option<String>,
    /// The rules tried before it, in order, with why each did not match.
    pub skipped: Vec<Skipped>,
}

/// A rule tried and passed over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// The rule.
    pub rule: String,
    /// Why it did not match.
    pub why: String,
}

/// The strictest of the operator's floor (`policy.floor`, [`super::floor`]) and the goal's
/// policy (deny over ask over allow; the floor's on a tie). For the goal's policy, the first rule
/// matching a call of `tool` decides it: the policy's rules in order, then the tool's
/// `_approval`, then the policy's mode (which always matches).
pub fn evaluate(tool: &Tool, call: &Call, policy: &Policy) -> Verdict {
    let goal = shorthand_verdict(tool, call, policy, true);
    match policy.floor.verdict(tool, call) {
        Some(f) if strictness(f.decision) >= strictness(goal.decision) => f,
        _ => goal,
    }
}

/// Strictness: deny over ask over allow.
pub(crate) fn strictness(d: RuleDecision) -> u8 {
    match d {
        RuleDecision::Allow => 0,
        RuleDecision::Ask => 1,
        RuleDecision::Deny => 2,
    }
}

/// One policy alone (its floor left out): its rules in order, then (with `overrides`) the
/// tool's `_approval`, then its mode. A floor layer reads no `_approval` a client could have
/// written (`overrides` false).
pub(crate) fn shorthand_verdict(
    tool: &Tool,
    call: &Call,
    policy: &Policy,
    overrides: bool,
) -> Verdict {
    if !policy.rules.is_empty() {
        let subject = call_subject(tool, call);
        if let Some(i) = policy
            .rules
            .iter()
            .position(|r| r.matches(&call.tool, &subject))
        {
            return Verdict {
                decision: policy.rules[i].spec.decision,
                source: Source::Rule(i),
            };
        }
    }
    shorthand(tool.approval.filter(|_| overrides), &call.tool, policy)
}

/// [`evaluate`], in words, with the rules that were passed over and why, and the layer that
/// decided.
pub fn explain(tool: &Tool, call: &Call, policy: &Policy) -> Explanation {
    let v = evaluate(tool, call, policy);
    if let Source::Floor { layer, .. } = v.source {
        let goal = shorthand_verdict(tool, call, policy, true);
        let kind = match policy.floor.layer(layer) {
            Some(Layer::Server { .. }) => "floor:server",
            Some(Layer::Agent { .. }) => "floor:agent",
            Some(Layer::McpTool { .. }) => "floor:mcp",
            Some(Layer::Kind { .. }) | None => "floor:kind",
        };
        return Explanation {
            decision: v.decision,
            rule: v.label(policy),
            reason: v.reason(policy, tool),
            layer: kind.into(),
            goal: Some(format!(
                "{} by {}",
                goal.decision.as_str(),
                goal.label(policy)
            )),
            skipped: Vec::new(),
        };
    }
    let tried = match v.source {
        Source::Rule(i) => i,
        _ => policy.rules.len(),
    };
    let skipped = policy.rules[..tried]
        .iter()
        .map(|r| Skipped {
            rule: r.label.clone(),
            why: if glob(&r.spec.tool, &call.tool) {
                "the call does not satisfy `when`".to_string()
            } else {
                format!("`{}` does not match the tool `{}`", r.spec.tool, call.tool)
            },
        })
        .collect();
    Explanation {
        decision: v.decision,
        rule: v.label(policy),
        reason: v.reason(policy, tool),
        layer: "goal".into(),
        goal: None,
        skipped,
    }
}

/// The old forms as the last rules: the tool's `_approval`, then the mode.
fn shorthand(approval: Option<ToolApproval>, name: &str, policy: &Policy) -> Verdict {
    let (decision, source) = match (approval, &policy.mode) {
        (Some(ToolApproval::Always), _) => (RuleDecision::Ask, Source::ToolOverride),
        (Some(ToolApproval::Never), _) => (RuleDecision::Allow, Source::ToolOverride),
        (None, Mode::Auto) => (RuleDecision::Allow, Source::Mode),
        (None, Mode::Ask) => (RuleDecision::Ask, Source::Mode),
        (None, Mode::Allowlist { allow }) if allow.contains(name) => {
            (RuleDecision::Allow, Source::Mode)
        }
        (None, Mode::Allowlist { .. }) => (RuleDecision::Ask, Source::Mode),
    };
    Verdict { decision, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_names() {
        for (p, n, m) in [
            ("*", "anything", true),
            ("*", "", true),
            ("fs_*", "fs_read", true),
            ("fs_*", "net_read", false),
            ("*_delete", "repo_delete", true),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
        ] {
            assert_eq!(glob(p, n), m, "{p} vs {n}");
        }
    }
}
