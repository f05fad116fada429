//! Stored runs on the command line: `dagloop runs`, `runs prune`, `show`, `decide`.
//!
//! Everything shown is rebuilt by replaying the run's journal through the same machine that ran
//! it; a decision is checked the same way (rule 21) before it is recorded.

use std::path::{Path as FsPath, PathBuf};

use serde_json::{Value, json};

use super::run::{RunOptions, policy_for};
use super::{CliError, pretty};
use crate::context::SanitizeLimits;
use crate::engine::config_for;
use crate::goal::Goal;
use crate::machine::{RunMachine, replay};
use crate::protocol::{Event, EventKind, Op};
use crate::store::{RunStore, SqliteStore, StoredRun};

fn err(e: impl std::fmt::Display + HasCode) -> CliError {
    CliError::new(e.code(), e.to_string())
}

/// Errors that carry a stable code.
pub(super) trait HasCode {
    fn code(&self) -> &'static str;
}
impl HasCode for crate::store::StoreError {
    fn code(&self) -> &'static str {
        crate::store::StoreError::code(self)
    }
}
impl HasCode for crate::engine::AgentError {
    fn code(&self) -> &'static str {
        crate::engine::AgentError::code(self)
    }
}
impl HasCode for crate::goal::GoalError {
    fn code(&self) -> &'static str {
        crate::goal::GoalError::code(self)
    }
}

/// The goal, policy and events of a stored run, rebuilt.
struct Rebuilt {
    machine: RunMachine,
    events: Vec<Event>,
}

fn rebuild(stored: &StoredRun) -> Result<Rebuilt, CliError> {
    let goal = Goal::from_json(
        &stored.record.goal.to_string(),
        FsPath::new(&stored.record.id),
        PathBuf::from(&stored.record.base_dir),
    )
    .map_err(err)?;
    let opts: RunOptions =
        serde_json::from_value(stored.record.options.clone()).unwrap_or_default();
    let policy = policy_for(&goal, opts.approve.as_deref())?;
    let config = config_for(&goal).map_err(err)?;
    let events = replay(
        &stored.record.id,
        config.clone(),
        policy.clone(),
        SanitizeLimits::default(),
        &stored.journal,
    );
    let mut machine = RunMachine::new(
        stored.record.id.clone(),
        config,
        policy,
        SanitizeLimits::default(),
    );
    for e in &stored.journal {
        machine.handle(e.input.clone(), e.at);
    }
    Ok(Rebuilt { machine, events })
}

pub(super) fn list(store: &SqliteStore, json_out: bool) -> Result<i32, CliError> {
    let rows = store.list().map_err(err)?;
    let now = super::run::now_ms();
    let mut out = Vec::new();
    for r in rows {
        let mut v = serde_json::to_value(&r).unwrap_or(Value::Null);
        // A stopped run that waits for reviewers says so, with how many.
        let mut waiting = 0usize;
        let mut step = Value::Null;
        if r.status == "stopped" || r.status == "running" {
            if let Ok(stored) = store.load(&r.id)
                && let Ok(rb) = rebuild(&stored)
            {
                waiting = rb.machine.awaiting().len();
                step = json!(
                    rb.events
                        .iter()
                        .filter(|e| e.parent.is_none())
                        .map(|e| e.step)
                        .max()
                );
            }
            if r.status == "stopped" && waiting > 0 {
                v["status"] = json!("waiting");
            }
        } else if let Ok(stored) = store.load(&r.id) {
            step = json!(stored.result.map(|x| x.steps));
        }
        v["waiting_approvals"] = json!(waiting);
        v["step"] = step;
        v["age_s"] = json!(now.saturating_sub(r.updated_at) / 1000);
        out.push(v);
    }
    if json_out {
        println!("{}", pretty(&Value::Array(out)));
    } else if out.is_empty() {
        println!("no runs in {}", store.path().display());
    } else {
        println!(
            "{:<36} {:<14} {:>5} {:>8} {:>9}",
            "RUN", "STATUS", "STEP", "AGE", "WAITING"
        );
        for v in &out {
            println!(
                "{:<36} {:<14} {:>5} {:>8} {:>9}",
                v["id"].as_str().unwrap_or(""),
                v["status"].as_str().unwrap_or(""),
                v["step"]
                    .as_u64()
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| "-".into()),
                age(v["age_s"].as_u64().unwrap_or(0)),
                v["waiting_approvals"],
            );
        }
    }
    Ok(0)
}

fn age(s: u64) -> String {
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// `30d`, `12h`, `45m`, `10s` as milliseconds.
pub(super) fn parse_age(s: &str) -> Result<u64, CliError> {
    let bad = || {
        CliError::new(
            "cli.bad_duration",
            format!("`{s}` is not a duration: write a number and a unit, e.g. 30d, 12h, 45m, 10s"),
        )
    };
    let (num, unit) = s.split_at(s.trim_end_matches(|c: char| c.is_ascii_alphabetic()).len());
    let n: u64 = num.parse().map_err(|_| bad())?;
    let per = match unit {
        "d" => 86_400_000,
        "h" => 3_600_000,
        "m" => 60_000,
        "s" => 1000,
        _ => return Err(bad()),
    };
    n.checked_mul(per).ok_or_else(bad)
}

pub(super) fn prune(store: &SqliteStore, older_than: &str) -> Result<i32, CliError> {
    let age = parse_age(older_than)?;
    let n = store
        .prune(super::run::now_ms().saturating_sub(age))
        .map_err(err)?;
    println!("{}", pretty(&json!({"status": "pruned", "runs": n})));
    Ok(0)
}

pub(super) fn decide(store: &SqliteStore, run: &str, op: Op) -> Result<i32, CliError> {
    let stored = store.load(run).map_err(err)?;
    if let Some(r) = &stored.result {
        return Err(CliError::new(
            "op.run_finished",
            format!("the run has finished ({})", r.status.as_str()),
        ));
    }
    let rb = rebuild(&stored)?;
    rb.machine
        .check_op(&op)
        .map_err(|e| CliError::new(e.code(), e.to_string()))?;
    store.push_op(run, &op).map_err(err)?;
    let live = stored.owner_pid.is_some();
    println!(
        "{}",
        pretty(&json!({
            "status": "recorded",
            "run_id": run,
            "next": if live { "the process running it applies the decision now" } else { "run `dagloop resume` to continue" },
        }))
    );
    Ok(0)
}

/// One span of the run's timeline.
#[derive(Debug, Clone, serde::Serialize)]
struct Span {
    what: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    call_id: Option<u64>,
    start_ms: u64,
    end_ms: u64,
}

pub(super) fn show(store: &SqliteStore, run: &str, json_out: bool) -> Result<i32, CliError> {
    let stored = store.load(run).map_err(err)?;
    let rb = rebuild(&stored)?;
    let t0 = rb.events.first().map_or(0, |e| e.at);
    let rel = |at: u64| at.saturating_sub(t0);
    let mut calls: std::collections::BTreeMap<u64, Value> = Default::default();
    let mut spans: Vec<Span> = Vec::new();
    let mut open: std::collections::BTreeMap<(u32, u64), u64> = Default::default();
    let mut asked: std::collections::BTreeMap<u64, u64> = Default::default();
    for e in &rb.events {
        let t = rel(e.at);
        let id = e.call.map(|c| c.0);
        let entry = |calls: &mut std::collections::BTreeMap<u64, Value>, id: u64| {
            calls
                .entry(id)
                .or_insert_with(|| json!({"id": id, "step": e.step, "depth": e.depth}))
                .clone()
        };
        match (&e.kind, id) {
            (EventKind::CallReceived { call }, Some(id)) => {
                let mut c = entry(&mut calls, id);
                c["tool"] = json!(call.tool);
                c["received_ms"] = json!(t);
                calls.insert(id, c);
            }
            (EventKind::ApprovalRequested { interrupted, .. }, Some(id)) => {
                asked.insert(id, t);
                let mut c = entry(&mut calls, id);
                c["asked_ms"] = json!(t);
                if *interrupted {
                    c["interrupted"] = json!(true);
                }
                calls.insert(id, c);
            }
            (
                EventKind::Decision {
                    decision,
                    timed_out,
                },
                Some(id),
            ) => {
                let mut c = entry(&mut calls, id);
                c["decision"] = json!(decision.name());
                c["decided_ms"] = json!(t);
                if *timed_out {
                    c["decision_timed_out"] = json!(true);
                }
                calls.insert(id, c);
                if let Some(a) = asked.remove(&id) {
                    spans.push(Span {
                        what: "reviewer".into(),
                        call_id: Some(id),
                        start_ms: a,
                        end_ms: t,
                    });
                }
            }
            (EventKind::Started { tool, .. }, Some(id)) => {
                let mut c = entry(&mut calls, id);
                c["started_ms"] = json!(t);
                c["tool"] = json!(tool);
                calls.insert(id, c);
            }
            (
                EventKind::Finished { .. } | EventKind::Failed { .. } | EventKind::Cancelled,
                Some(id),
            ) => {
                let mut c = entry(&mut calls, id);
                c["ended_ms"] = json!(t);
                c["status"] = json!(match &e.kind {
                    EventKind::Finished { .. } => "done",
                    EventKind::Failed { kind, .. } => kind.as_str(),
                    _ => "cancelled",
                });
                if let EventKind::Failed { error, .. } = &e.kind {
                    c["error"] = error.clone();
                }
                if let Some(s) = c["started_ms"].as_u64() {
                    spans.push(Span {
                        what: format!("call {}", c["tool"].as_str().unwrap_or("")),
                        call_id: Some(id),
                        start_ms: s,
                        end_ms: t,
                    });
                }
                calls.insert(id, c);
            }
            (EventKind::RequestStarted { .. }, None) => {
                open.insert((e.depth, e.parent.map_or(0, |p| p.0)), t);
            }
            (EventKind::Solution { .. }, None) => {
                if let Some(s) = open.remove(&(e.depth, e.parent.map_or(0, |p| p.0))) {
                    spans.push(Span {
                        what: format!("model step {}", e.step),
                        call_id: None,
                        start_ms: s,
                        end_ms: t,
                    });
                }
            }
            _ => {}
        }
    }
    let end = rb.events.last().map_or(0, |e| rel(e.at));
    let critical = critical_path(&spans, end);
    let status = match (&stored.result, stored.owner_pid) {
        (Some(r), _) => r.status.as_str().to_string(),
        (None, Some(_)) => "running".into(),
        (None, None) if !rb.machine.awaiting().is_empty() => "waiting".into(),
        (None, None) => "stopped".into(),
    };
    let out = json!({
        "id": stored.record.id,
        "status": status,
        "duration_ms": end,
        "journal_entries": stored.journal.len(),
        "calls": calls.values().collect::<Vec<_>>(),
        "critical_path": critical,
        "awaiting": rb.machine.awaiting().iter().map(|(id, c)| json!({"call_id": id, "call": c})).collect::<Vec<_>>(),
        "state": stored.result.as_ref().map(|r| r.state.clone()),
        "output": stored.result.as_ref().map(|r| r.output.clone()),
        "error": stored.result.as_ref().and_then(|r| r.error.clone()),
    });
    if json_out {
        println!("{}", pretty(&out));
        return Ok(0);
    }
    println!(
        "run {} · {} · {} ms · {} journal entries",
        out["id"].as_str().unwrap_or(""),
        status,
        end,
        stored.journal.len()
    );
    println!("\ncalls (ms from the run's start):");
    for c in calls.values() {
        let f = |k: &str| {
            c[k].as_u64()
                .map(|v| v.to_string())
                .unwrap_or_else(|| "-".into())
        };
        println!(
            "  c{:<4} {:<24} {:<10} received {:>6}  decided {:>6}  ran {:>6} → {:>6}  {}",
            c["id"],
            c["tool"].as_str().unwrap_or("?"),
            c["status"].as_str().unwrap_or("pending"),
            f("received_ms"),
            f("decided_ms"),
            f("started_ms"),
            f("ended_ms"),
            c["decision"]
                .as_str()
                .map(|d| format!("({d})"))
                .unwrap_or_default(),
        );
    }
    println!("\ncritical path (what set the run's duration):");
    for s in &critical {
        println!("  {:>6} → {:>6}  {}", s.start_ms, s.end_ms, s.what);
    }
    if let Some(r) = &stored.result {
        println!("\nstate: {}", r.state);
        println!("output: {}", r.output);
    }
    Ok(0)
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
            .filter(|(i, s)| !used[*i] && s.end_ms <= at && s.end_ms > s.start_ms.saturating_sub(1))
            .max_by_key(|(_, s)| (s.end_ms, u64::MAX - s.start_ms));
        let Some((i, s)) = best else { break };
        used[i] = true;
        path.push(s.clone());
        if s.start_ms == 0 || s.start_ms >= at {
            break;
        }
        at = s.start_ms;
    }
    path.reverse();
    path
}
