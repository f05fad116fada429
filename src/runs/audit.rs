//! A run's audit trail: every decision about its calls (who, through which channel, when, and
//! the rule or standing approval it came from), every decision recorded but dropped (its
//! presentation was decided otherwise or presented again first) and every standing approval
//! given or revoked, in the order they happened, read from the run's events. `dagloop show RUN
//! --audit` and `GET /runs/{id}/audit` print it.
//!
//! A standing approval is named by the key `standing` (`what: allow` when given). Before it got
//! its own name it was a "grant": the entries repeat its id under `grant` for one release
//! (docs/approval.md).
//!
//! Deliberately not here: calls the rules let run without asking (they have no decision; the
//! call's `asked_by_rule` and the policy say why), or deciding anything.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::protocol::{Event, EventKind};

/// The audit entries of a run's events, oldest first.
pub fn audit(events: &[Event]) -> Vec<Value> {
    let mut tools: BTreeMap<u64, String> = BTreeMap::new();
    let mut asked: BTreeMap<u64, (Option<String>, u64)> = BTreeMap::new();
    let mut out = Vec::new();
    for e in events {
        let call = e.call.map(|c| c.0);
        match &e.kind {
            EventKind::CallReceived { call: c } => {
                if let Some(id) = call {
                    tools.insert(id, c.tool.clone());
                }
            }
            EventKind::ApprovalRequested { call: c, rule, .. } => {
                if let Some(id) = call {
                    tools.insert(id, c.tool.clone());
                    asked.insert(id, (rule.clone(), e.at));
                }
            }
            EventKind::Decision {
                decision,
                timed_out,
                by,
                rule,
                standing,
            } => {
                let id = call.unwrap_or_default();
                let (asked_rule, asked_at) = asked.remove(&id).unzip();
                let mut v = json!({
                    "seq": e.seq,
                    "at": e.at,
                    "what": "decision",
                    "call_id": call,
                    "tool": tools.get(&id),
                    "decision": decision.name(),
                    "principal": by.as_ref().map(|b| b.principal.clone()),
                    "channel": by.as_ref().map(|b| b.channel.clone()),
                });
                let extra = [
                    (
                        "rule",
                        rule.clone().or(asked_rule.flatten()).map(Value::from),
                    ),
                    ("standing", standing.clone().map(Value::from)),
                    // The old key, for one release.
                    ("grant", standing.clone().map(Value::from)),
                    ("asked_at", asked_at.map(Value::from)),
                    ("timed_out", timed_out.then_some(Value::Bool(true))),
                    ("depth", (e.depth > 0).then(|| Value::from(e.depth))),
                ];
                if let Some(m) = v.as_object_mut() {
                    for (k, x) in extra {
                        if let Some(x) = x {
                            m.insert(k.into(), x);
                        }
                    }
                    if let crate::protocol::Decision::Reject { reason } = decision {
                        m.insert("reason".into(), json!(reason));
                    }
                }
                out.push(v);
            }
            EventKind::DecisionDropped {
                decision,
                by,
                presentation,
                code,
            } => out.push(json!({
                "seq": e.seq,
                "at": e.at,
                "what": "dropped",
                "call_id": call,
                "tool": call.and_then(|id| tools.get(&id)),
                "decision": decision.name(),
                "principal": by.as_ref().map(|b| b.principal.clone()),
                "channel": by.as_ref().map(|b| b.channel.clone()),
                "presentation": presentation,
                "code": code,
            })),
            EventKind::StandingApprovalAdded { id, standing, by } => out.push(json!({
                "seq": e.seq,
                "at": e.at,
                "what": "allow",
                "standing": id,
                "grant": id,
                "covers": standing,
                "principal": by.as_ref().map(|b| b.principal.clone()),
                "channel": by.as_ref().map(|b| b.channel.clone()),
            })),
            EventKind::StandingApprovalRevoked { id, by } => out.push(json!({
                "seq": e.seq,
                "at": e.at,
                "what": "revoke",
                "standing": id,
                "grant": id,
                "principal": by.as_ref().map(|b| b.principal.clone()),
                "channel": by.as_ref().map(|b| b.channel.clone()),
            })),
            EventKind::RunFinished {
                status,
                by: Some(by),
            } if e.parent.is_none() => {
                out.push(json!({
                    "seq": e.seq,
                    "at": e.at,
                    "what": "cancel",
                    "status": status,
                    "principal": by.principal,
                    "channel": by.channel,
                }));
            }
            _ => {}
        }
    }
    out
}

/// The standing approvals of a run with the calls each approved: `[{id, covers, by, revoked,
/// calls}]`.
pub fn standing(events: &[Event]) -> Vec<Value> {
    let mut list: Vec<Value> = Vec::new();
    for e in events {
        match &e.kind {
            EventKind::StandingApprovalAdded { id, standing, by } => list.push(json!({
                "id": id,
                "covers": standing,
                "by": by,
                "at": e.at,
                "revoked": false,
                "calls": [],
            })),
            EventKind::StandingApprovalRevoked { id, .. } => {
                if let Some(g) = list.iter_mut().find(|g| g["id"] == json!(id)) {
                    g["revoked"] = json!(true);
                }
            }
            EventKind::Decision {
                standing: Some(id), ..
            } => {
                if let (Some(g), Some(c)) = (list.iter_mut().find(|g| g["id"] == json!(id)), e.call)
                    && let Some(calls) = g["calls"].as_array_mut()
                {
                    calls.push(json!(c.0));
                }
            }
            _ => {}
        }
    }
    list
}

/// The audit as lines for a terminal: `seq  time  call tool  decision  by principal (channel)
/// [rule|standing]`.
pub fn lines(entries: &[Value]) -> Vec<String> {
    entries
        .iter()
        .map(|v| {
            let s = |k: &str| v[k].as_str().unwrap_or("").to_string();
            // A run compacted before the rename kept its entries with `grant` only.
            let standing = v["standing"].as_str().or(v["grant"].as_str());
            let who = match (v["principal"].as_str(), v["channel"].as_str()) {
                (Some(p), Some(c)) => format!("by {p} ({c})"),
                _ => "by nobody recorded".into(),
            };
            let head = format!("#{:<4} at {}", v["seq"], v["at"]);
            match s("what").as_str() {
                "decision" => {
                    let mut line = format!(
                        "{head}  c{} {}  {}  {who}",
                        v["call_id"],
                        s("tool"),
                        s("decision")
                    );
                    if let Some(r) = v["rule"].as_str() {
                        line.push_str(&format!("  rule {r}"));
                    }
                    if let Some(g) = standing {
                        line.push_str(&format!("  standing {g}"));
                    }
                    if v["timed_out"] == json!(true) {
                        line.push_str("  (timed out)");
                    }
                    if let Some(r) = v["reason"].as_str() {
                        line.push_str(&format!("  reason: {r}"));
                    }
                    line
                }
                "dropped" => format!(
                    "{head}  c{} {}  {} dropped, never applied ({})  {who}",
                    v["call_id"],
                    s("tool"),
                    s("decision"),
                    s("code")
                ),
                "allow" | "grant" => format!(
                    "{head}  allow {}  {}  {who}",
                    standing.unwrap_or(""),
                    v["covers"]
                ),
                "revoke" => format!("{head}  revoke {}  {who}", standing.unwrap_or("")),
                other => format!("{head}  {other} ({})  {who}", s("status")),
            }
        })
        .collect()
}
