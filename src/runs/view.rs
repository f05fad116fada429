//! A run described from its journal: every call with its status and times, the timeline of
//! calls, reviewer waits and model turns, the critical path, what awaits a decision, and the
//! result. `dagloop show` prints it; the server returns it.

use std::collections::BTreeMap;
use std::path::{Path as FsPath, PathBuf};

use serde_json::{Value, json};

use super::{RunOptions, RunsError, policy_for};
use crate::context::SanitizeLimits;
use crate::engine::config_for;
use crate::goal::Goal;
use crate::machine::{JournalEntry, RunMachine, RunResult, replay};
use crate::protocol::{Event, EventKind, params_hash};
use crate::store::RunRecord;

/// A stored or live run rebuilt by replaying its journal through the machine that ran it.
pub struct Rebuilt {
    /// The goal as recorded.
    pub goal: Goal,
    /// The machine after the whole journal (what awaits a decision, whether an op applies).
    pub machine: RunMachine,
    /// The events the run published (live-only ones excepted).
    pub events: Vec<Event>,
    /// When each model stream closed: the agent (its delegate call, None for the run's own
    /// agent) and the time.
    pub streams_closed: Vec<(Option<u64>, u64)>,
    /// Who cancelled the run, when its cancellation said so.
    pub cancelled_by: Option<crate::protocol::Actor>,
}

/// The machine of the run `record` describes after `journal`, without its events: what awaits
/// a decision, what a resume would present.
pub fn rebuild_machine(
    record: &RunRecord,
    journal: &[JournalEntry],
) -> Result<RunMachine, RunsError> {
    let (_, config, policy) = parts(record)?;
    Ok(machine_after(record, config, policy, journal))
}

fn parts(
    record: &RunRecord,
) -> Result<
    (
        Goal,
        std::sync::Arc<crate::machine::AgentConfig>,
        crate::approval::Policy,
    ),
    RunsError,
> {
    let goal = Goal::from_json(
        &record.goal.to_string(),
        FsPath::new(&record.id),
        PathBuf::from(&record.base_dir),
    )?;
    let opts = RunOptions::from_stored(&record.options)?;
    let policy = policy_for(&goal, opts.approve);
    let config = config_for(&goal)?;
    Ok((goal, config, policy))
}

fn machine_after(
    record: &RunRecord,
    config: std::sync::Arc<crate::machine::AgentConfig>,
    policy: crate::approval::Policy,
    journal: &[JournalEntry],
) -> RunMachine {
    let mut machine =
        RunMachine::replaying(record.id.clone(), config, policy, SanitizeLimits::default());
    for e in journal {
        machine.handle(e.input.clone(), e.at);
    }
    machine
}

/// Replays `journal` for the run `record` describes.
pub fn rebuild(record: &RunRecord, journal: &[JournalEntry]) -> Result<Rebuilt, RunsError> {
    let (goal, config, policy) = parts(record)?;
    let events = replay(
        &record.id,
        config.clone(),
        policy.clone(),
        SanitizeLimits::default(),
        journal,
    );
    let machine = machine_after(record, config, policy, journal);
    let streams_closed = journal
        .iter()
        .filter_map(|e| match &e.input {
            crate::machine::RunInput::StreamClosed { frame, .. } => {
                Some((frame.map(|c| c.0), e.at))
            }
            _ => None,
        })
        .collect();
    let cancelled_by = journal.iter().find_map(|e| match &e.input {
        crate::machine::RunInput::Cancel { by, .. } => by.clone(),
        _ => None,
    });
    Ok(Rebuilt {
        goal,
        machine,
        events,
        streams_closed,
        cancelled_by,
    })
}

/// One span of the run's timeline (ms from the run's start).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
struct Span {
    what: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    call_id: Option<u64>,
    start_ms: u64,
    end_ms: u64,
}

/// The description of a run: `live` says whether a process runs it now (a call that started
/// and did not finish in a run nobody runs was interrupted).
pub fn describe(
    id: &str,
    rb: &Rebuilt,
    journal_entries: usize,
    result: Option<&RunResult>,
    live: bool,
) -> Value {
    let t0 = rb.events.first().map_or(0, |e| e.at);
    let rel = |at: u64| at.saturating_sub(t0);
    let mut calls: BTreeMap<u64, Value> = BTreeMap::new();
    let mut spans: Vec<Span> = Vec::new();
    let mut turns: BTreeMap<(u32, u64), u64> = BTreeMap::new();
    let mut asked: BTreeMap<u64, u64> = BTreeMap::new();
    // Turns that went to the next model of their agent's list, as journaled.
    let mut fallbacks: Vec<Value> = Vec::new();
    // Turns re-asked without streaming after their stream broke, and contexts compacted after
    // the provider refused them as too long.
    let mut reasks: Vec<Value> = Vec::new();
    let mut compactions: Vec<Value> = Vec::new();
    for e in &rb.events {
        let t = rel(e.at);
        if let Some(id) = e.call.map(|c| c.0) {
            let c = calls.entry(id).or_insert_with(
                || json!({"id": id, "step": e.step, "depth": e.depth, "status": "pending"}),
            );
            if let Some(span) = call_event(c, &e.kind, t, &mut asked, id) {
                spans.push(span);
            }
            continue;
        }
        let frame = (e.depth, e.parent.map_or(0, |p| p.0));
        match &e.kind {
            EventKind::RequestStarted { .. } => {
                turns.insert(frame, t);
            }
            EventKind::ModelFallback {
                from,
                to,
                code,
                error,
            } => fallbacks.push(json!({
                "step": e.step,
                "depth": e.depth,
                "delegate_call": e.parent.map(|p| p.0),
                "at_ms": t,
                "from": from,
                "to": to,
                "code": code,
                "error": error,
            })),
            EventKind::StreamReasked {
                model,
                code,
                calls_kept,
                ..
            } => reasks.push(json!({
                "step": e.step,
                "depth": e.depth,
                "at_ms": t,
                "model": model,
                "code": code,
                "calls_kept": calls_kept,
            })),
            EventKind::ContextCompacted {
                chars,
                level,
                refused_chars,
            } => compactions.push(json!({
                "step": e.step,
                "depth": e.depth,
                "at_ms": t,
                "level": level,
                "chars": chars,
                "refused_chars": refused_chars,
            })),
            EventKind::Solution { .. } => {
                if let Some(s) = turns.remove(&frame) {
                    // The model's part of the step ends when its stream closes; the calls
                    // it streamed have their own spans.
                    let closed = rb
                        .streams_closed
                        .iter()
                        .filter(|(f, at)| {
                            *f == e.parent.map(|p| p.0) && (s..=t).contains(&rel(*at))
                        })
                        .map(|(_, at)| rel(*at))
                        .next()
                        .unwrap_or(t);
                    spans.push(Span {
                        what: format!("model step {}", e.step),
                        call_id: None,
                        start_ms: s,
                        end_ms: closed,
                    });
                }
            }
            _ => {}
        }
    }
    if !live && result.is_none() {
        for c in calls.values_mut() {
            if c["status"] == "running" {
                c["status"] = json!("interrupted");
            }
        }
    }
    let end = rb.events.last().map_or(0, |e| rel(e.at));
    let critical = critical_path(&spans, end);
    let awaiting = awaiting(rb);
    let status = match result {
        Some(r) => r.status.as_str().to_string(),
        None if !awaiting.is_empty() => "waiting".into(),
        None if live => "running".into(),
        None => "stopped".into(),
    };
    let mut out = json!({
        "id": id,
        "status": status,
        "duration_ms": end,
        "journal_entries": journal_entries,
        "calls": calls.into_values().collect::<Vec<_>>(),
        "spans": spans,
        "critical_path": critical,
        "awaiting": awaiting,
        "model_fallbacks": fallbacks,
        "stream_reasks": reasks,
        "context_compactions": compactions,
        "usage": result.map(|r| r.usage.clone()),
        "state": result.map_or_else(|| rb.machine.state_view(), |r| Some(r.state.clone())),
        "output": result.map(|r| r.output.clone()),
        "error": result.and_then(|r| r.error.clone()),
    });
    if let Some(by) = &rb.cancelled_by {
        out["cancelled_by"] = json!(by);
    }
    out
}

/// Folds one event into its call's description; returns the span it closes, if any.
fn call_event(
    c: &mut Value,
    kind: &EventKind,
    t: u64,
    asked: &mut BTreeMap<u64, u64>,
    id: u64,
) -> Option<Span> {
    match kind {
        EventKind::CallReceived { call } => {
            c["tool"] = json!(call.tool);
            c["params"] = json!(call.params);
            c["received_ms"] = json!(t);
        }
        EventKind::CallRefused { reason, .. } => {
            c["status"] = json!("refused");
            c["error"] = json!(reason);
        }
        EventKind::Blocked { waiting_on } => {
            c["status"] = json!("blocked");
            c["waiting_on"] = json!(waiting_on);
        }
        EventKind::Unblocked => {
            c["status"] = json!("pending");
            if let Some(m) = c.as_object_mut() {
                m.remove("waiting_on");
            }
        }
        EventKind::Unresolved { missing } => {
            c["status"] = json!("unresolved");
            c["waiting_on"] = json!(missing);
        }
        EventKind::ApprovalRequested {
            call, interrupted, ..
        } => {
            asked.insert(id, t);
            c["status"] = json!("awaiting_approval");
            c["tool"] = json!(call.tool);
            c["params"] = json!(call.params);
            c["asked_ms"] = json!(t);
            if *interrupted {
                c["interrupted"] = json!(true);
            }
        }
        EventKind::Decision {
            decision,
            timed_out,
            by,
        } => {
            c["decision"] = json!(decision.name());
            if let Some(by) = by {
                c["decided_by"] = json!(by);
            }
            c["decided_ms"] = json!(t);
            c["status"] = json!(if decision.name() == "reject" {
                "rejected"
            } else {
                "pending"
            });
            if *timed_out {
                c["decision_timed_out"] = json!(true);
            }
            if let Some(a) = asked.remove(&id) {
                return Some(Span {
                    what: "reviewer".into(),
                    call_id: Some(id),
                    start_ms: a,
                    end_ms: t,
                });
            }
        }
        EventKind::Started { tool, params } => {
            c["status"] = json!("running");
            c["started_ms"] = json!(t);
            c["tool"] = json!(tool);
            c["params"] = json!(params);
        }
        EventKind::Finished { .. } | EventKind::Failed { .. } | EventKind::Cancelled => {
            c["ended_ms"] = json!(t);
            c["status"] = json!(match kind {
                EventKind::Finished { .. } => "done",
                EventKind::Failed { kind, .. } => kind.as_str(),
                _ => "cancelled",
            });
            if let EventKind::Failed { error, .. } = kind {
                c["error"] = Value::clone(error);
            }
            if let Some(s) = c["started_ms"].as_u64() {
                return Some(Span {
                    what: format!("call {}", c["tool"].as_str().unwrap_or("")),
                    call_id: Some(id),
                    start_ms: s,
                    end_ms: t,
                });
            }
        }
        _ => {}
    }
    None
}

/// The calls awaiting a decision, with what a reviewer needs: the resolved call, the
/// fingerprint a decision may quote, whether it was interrupted, and the tool's params schema.
fn awaiting(rb: &Rebuilt) -> Vec<Value> {
    rb.machine
        .awaiting()
        .into_iter()
        .map(|(id, call)| {
            let interrupted = rb.events.iter().rev().find_map(|e| match &e.kind {
                EventKind::ApprovalRequested { interrupted, .. } if e.call == Some(id) => {
                    Some(*interrupted)
                }
                _ => None,
            });
            let schema = rb.goal.tools.iter().find(|t| t.name == call.tool).map(|t| {
                // The params' schema only: tool configuration (`_http` URLs, headers) is
                // the operator's, not the reviewer's.
                let mut m = t.schema.clone();
                m.retain(|k, _| !k.starts_with('_'));
                Value::Object(m)
            });
            json!({
                "call_id": id,
                "params_hash": params_hash(&call),
                "interrupted": interrupted.unwrap_or(false),
                "tool_schema": schema,
                "call": call,
            })
        })
        .collect()
}

/// Walks back from the end: the span that ended last before the current point, then the one
/// that ended last before that span started, and so on.
fn critical_path(spans: &[Span], end: u64) -> Vec<Span> {
    let mut path = Vec::new();
    let mut at = end;
    let mut used = vec![false; spans.len()];
    loop {
        let best = spans
            .iter()
            .enumerate()
            .filter(|(i, s)| !used[*i] && s.end_ms <= at)
            .max_by_key(|(_, s)| (s.end_ms, s.start_ms));
        let Some((i, s)) = best else { break };
        used[i] = true;
        path.push(s.clone());
        // A zero-length span (a model turn answered at once) moves nothing: the path goes on
        // from its start, through what ended there. Each span is used once, so this ends.
        if s.start_ms == 0 {
            break;
        }
        at = s.start_ms;
    }
    path.reverse();
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(what: &str, start_ms: u64, end_ms: u64) -> Span {
        Span {
            what: what.into(),
            call_id: None,
            start_ms,
            end_ms,
        }
    }

    #[test]
    fn a_zero_length_span_at_the_end_does_not_cut_the_critical_path() {
        let spans = [
            span("model step 1", 0, 10),
            span("call a", 10, 710),
            span("call b", 10, 705),
            span("call c", 10, 700),
            span("model step 2", 710, 710),
        ];
        let path: Vec<String> = critical_path(&spans, 710)
            .into_iter()
            .map(|s| s.what)
            .collect();
        assert_eq!(path, ["model step 1", "call a", "model step 2"]);
    }
}
