//! The outer loop without a runtime: inputs in, actions out. One test per termination rule.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::*;
use crate::goal::Goal;
use crate::protocol::{Call, Decision, Op, OpError};

fn config(goal: Value) -> Arc<AgentConfig> {
    let mut doc = json!({"goal": "g", "output_schema": {"type": "object", "required": ["answer"]},
        "tools": [{"_tool": "note", "_output": {"type": "string"}},
                  {"_tool": "act", "_activity": "rust", "type": "object"}]});
    if let (Some(d), Some(extra)) = (doc.as_object_mut(), goal.as_object()) {
        d.extend(extra.clone());
    }
    let g = Goal::from_json(&doc.to_string(), "t".as_ref(), ".".into()).expect("goal");
    Arc::new(g.agent_config(BTreeMap::new()).expect("config"))
}

pub(super) fn machine(goal: Value, policy: Policy) -> RunMachine {
    RunMachine::new("run-t", config(goal), policy, SanitizeLimits::default())
}

pub(super) fn call(v: Value) -> Call {
    Call::try_from(v).expect("call")
}

/// Feeds one model turn (calls, output) and closes its stream.
fn turn(m: &mut RunMachine, calls: &[Value], output: Value, now: Millis) -> Vec<Action> {
    let mut out = Vec::new();
    for c in calls {
        m.handle_into(
            RunInput::Call {
                frame: None,
                call: call(c.clone()).into(),
                parsed: Default::default(),
            },
            now,
            &mut out,
        );
    }
    if !output.is_null() {
        m.handle_into(
            RunInput::Output {
                frame: None,
                output,
            },
            now,
            &mut out,
        );
    }
    m.handle_into(
        RunInput::StreamClosed {
            frame: None,
            error: None,
            finish_reason: None,
        },
        now,
        &mut out,
    );
    out
}

pub(super) fn result(actions: &[Action]) -> Option<RunResult> {
    actions.iter().find_map(|a| match a {
        Action::Finished(r) => Some((**r).clone()),
        _ => None,
    })
}

fn requests(actions: &[Action]) -> usize {
    actions
        .iter()
        .filter(|a| matches!(a, Action::Request { .. }))
        .count()
}

fn kinds(actions: &[Action]) -> Vec<&'static str> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Emit(e) => Some(e.kind.name()),
            _ => None,
        })
        .collect()
}

#[test]
fn start_asks_the_model_and_a_valid_output_succeeds() {
    let mut m = machine(json!({}), Policy::auto());
    let a = m.handle(RunInput::Start, 10);
    assert_eq!(requests(&a), 1);
    assert_eq!(kinds(&a), vec!["run_started", "request_started"]);
    let a = turn(&mut m, &[], json!({"answer": 1}), 20);
    let r = result(&a).expect("finished");
    assert_eq!(
        (r.status, r.output.clone(), r.steps),
        (RunStatus::Succeeded, json!({"answer": 1}), 1)
    );
    assert_eq!(m.finished(), Some(RunStatus::Succeeded));
    assert!(
        m.handle(RunInput::Start, 30).is_empty(),
        "a finished run takes no input"
    );
}

#[test]
fn rule15_an_invalid_output_is_sent_back_then_fails_after_the_retries() {
    let mut m = machine(json!({"limits": {"max_output_retries": 1}}), Policy::auto());
    m.handle(RunInput::Start, 0);
    let a = turn(&mut m, &[], json!({"wrong": 1}), 1);
    assert!(kinds(&a).contains(&"output_invalid"));
    assert_eq!(requests(&a), 1, "sent back once");
    let a = turn(&mut m, &[], json!({"wrong": 2}), 2);
    let r = result(&a).expect("finished");
    assert_eq!(r.status, RunStatus::InvalidOutput);
    let err = r.error.expect("error");
    assert_eq!(err.code, "run.invalid_output");
    assert!(err.errors[0].contains("answer"), "{:?}", err.errors);
}

#[test]
fn rule19_output_references_are_resolved_and_a_reference_to_nothing_is_an_error() {
    let mut m = machine(json!({"state": {"found": 42}}), Policy::auto());
    m.handle(RunInput::Start, 0);
    let a = turn(&mut m, &[], json!({"answer": "†state.missing"}), 1);
    assert!(kinds(&a).contains(&"output_invalid"));
    let a = turn(&mut m, &[], json!({"answer": "†state.found"}), 2);
    assert_eq!(result(&a).expect("done").output, json!({"answer": 42}));
}

#[test]
fn rule20_a_latent_output_that_breaks_its_schema_is_not_written() {
    let mut m = machine(json!({}), Policy::auto());
    m.handle(RunInput::Start, 0);
    let a = turn(
        &mut m,
        &[json!({"_tool": "note", "_output": 7, "_outputPath": "†state.n"})],
        Value::Null,
        1,
    );
    assert!(kinds(&a).contains(&"failed"), "{:?}", kinds(&a));
    assert!(!kinds(&a).contains(&"written"));
}

#[test]
fn rule16_max_steps() {
    let mut m = machine(json!({"limits": {"max_steps": 2}}), Policy::auto());
    m.handle(RunInput::Start, 0);
    turn(
        &mut m,
        &[json!({"_tool": "note", "_output": "a"})],
        Value::Null,
        1,
    );
    let a = turn(
        &mut m,
        &[json!({"_tool": "note", "_output": "b"})],
        Value::Null,
        2,
    );
    assert_eq!(result(&a).map(|r| r.status), Some(RunStatus::MaxSteps));
}

#[test]
fn rule16_doom_loop() {
    let mut m = machine(json!({}), Policy::auto());
    m.handle(RunInput::Start, 0);
    let same = [json!({"_tool": "note", "_output": "same"})];
    turn(&mut m, &same, Value::Null, 1);
    turn(&mut m, &same, Value::Null, 2);
    let a = turn(&mut m, &same, Value::Null, 3);
    assert_eq!(
        result(&a).map(|r| (r.status, r.steps)),
        Some((RunStatus::DoomLoop, 3))
    );
}

#[test]
fn rule16_empty_turns() {
    let mut m = machine(json!({}), Policy::auto());
    m.handle(RunInput::Start, 0);
    turn(&mut m, &[], Value::Null, 1);
    let a = turn(&mut m, &[], Value::Null, 2);
    assert_eq!(result(&a).map(|r| r.status), Some(RunStatus::EmptyTurns));
}

#[test]
fn rule16_token_budget() {
    let mut m = machine(json!({"limits": {"token_budget": 100}}), Policy::auto());
    m.handle(RunInput::Start, 0);
    let mut out = Vec::new();
    let usage = RunInput::Usage {
        frame: None,
        input_tokens: 90,
        output_tokens: 20,
        estimated: false,
        cache_read_tokens: 0,
        cache_write_tokens: 0,
        model: None,
    };
    m.handle_into(usage, 1, &mut out);
    out.extend(turn(
        &mut m,
        &[json!({"_tool": "note", "_output": "x"})],
        Value::Null,
        1,
    ));
    let r = result(&out).expect("finished");
    assert_eq!((r.status, r.usage.total()), (RunStatus::TokenBudget, 110));
}

#[test]
fn rule16_the_deadline_timer_stops_the_run_and_closes_the_stream() {
    let mut m = machine(json!({"limits": {"timeout_s": 2}}), Policy::auto());
    m.handle(RunInput::Start, 1000);
    assert_eq!(m.poll_timeout(), Some(3000));
    let a = m.handle(
        RunInput::TimerFired {
            timer: Timer::Deadline { frame: None },
        },
        3000,
    );
    assert!(
        a.iter()
            .any(|x| matches!(x, Action::CloseStream { frame: None }))
    );
    assert_eq!(result(&a).map(|r| r.status), Some(RunStatus::Timeout));
}

#[test]
fn rule16_cancel_aborts_running_calls() {
    let mut m = machine(json!({}), Policy::auto());
    m.handle(RunInput::Start, 0);
    let mut out = Vec::new();
    m.handle_into(
        RunInput::Call {
            frame: None,
            call: call(json!({"_tool": "act"})).into(),
            parsed: Default::default(),
        },
        1,
        &mut out,
    );
    assert!(
        out.iter()
            .any(|x| matches!(x, Action::Launch { id: CallId(1), .. }))
    );
    let a = m.handle(
        RunInput::Cancel {
            reason: "stop".into(),
            by: None,
        },
        2,
    );
    assert!(
        a.iter()
            .any(|x| matches!(x, Action::Abort { id: CallId(1) }))
    );
    assert_eq!(result(&a).map(|r| r.status), Some(RunStatus::Cancelled));
}

#[test]
fn rule17_a_model_failure_ends_the_run_with_its_cause() {
    let mut m = machine(json!({}), Policy::auto());
    m.handle(RunInput::Start, 0);
    let retry = RunInput::Retry {
        frame: None,
        attempt: 1,
        status: Some(503),
        wait_ms: 5,
        error: "down".into(),
    };
    let a = m.handle(retry, 1);
    assert_eq!(kinds(&a), vec!["model_retry", "request_started"]);
    let mut err = RunError::new("run.model_error", "the model failed");
    err.cause = Some(json!({"code": "llm.http_status"}));
    let a = m.handle(
        RunInput::StreamClosed {
            frame: None,
            error: Some(Box::new(err)),
            finish_reason: None,
        },
        2,
    );
    let r = result(&a).expect("finished");
    assert_eq!(r.status, RunStatus::ModelError);
    assert_eq!(
        r.error.and_then(|e| e.cause),
        Some(json!({"code": "llm.http_status"}))
    );
}

#[test]
fn ops_are_refused_with_typed_reasons_rule21() {
    let mut m = machine(json!({}), Policy::ask());
    m.handle(RunInput::Start, 0);
    let mut out = Vec::new();
    m.handle_into(
        RunInput::Call {
            frame: None,
            call: call(json!({"_tool": "act", "x": 1})).into(),
            parsed: Default::default(),
        },
        1,
        &mut out,
    );
    let hash = out
        .iter()
        .find_map(|a| match a {
            Action::Emit(e) => match &e.kind {
                crate::protocol::EventKind::ApprovalRequested {
                    params_hash, path, ..
                } => {
                    assert_eq!(path, &vec![CallId(1)]);
                    Some(params_hash.clone())
                }
                _ => None,
            },
            _ => None,
        })
        .expect("approval requested");
    let decide = |call: u64, decision: Decision, presented: Option<&str>| Op::Decide {
        call: CallId(call),
        decision,
        presented: presented.map(String::from),
        presentation: None,
        by: None,
    };
    let code = |m: &RunMachine, op: Op| m.check_op(&op).err().map(|e| e.code());
    assert_eq!(
        code(&m, decide(9, Decision::Approve, None)),
        Some("op.unknown_call")
    );
    assert_eq!(
        code(&m, decide(1, Decision::Approve, Some("0000"))),
        Some("op.stale")
    );
    let edit_tool = Decision::Edit {
        params: json!({"_tool": "note"})
            .as_object()
            .cloned()
            .unwrap_or_default(),
    };
    assert_eq!(
        code(&m, decide(1, edit_tool, None)),
        Some("op.edit_changes_tool")
    );
    let unknown = Decision::Replace {
        call: Box::new(call(json!({"_tool": "nope"}))),
    };
    assert_eq!(
        code(&m, decide(1, unknown, None)),
        Some("op.invalid_decision")
    );
    assert_eq!(code(&m, decide(1, Decision::Approve, Some(&hash))), None);
    let by = crate::protocol::Actor::new("alice", crate::protocol::Actor::HTTP);
    let decided = m.handle(
        RunInput::Decided {
            call: CallId(1),
            decision: Decision::Approve,
            by: Some(by.clone()),
            presentation: None,
        },
        2,
    );
    // The decision's author is on its event.
    assert!(
        decided.iter().any(|a| matches!(a, Action::Emit(e)
            if matches!(&e.kind, crate::protocol::EventKind::Decision { by: Some(b), .. } if *b == by))),
        "{decided:?}"
    );
    assert_eq!(
        code(&m, decide(1, Decision::Approve, None)),
        Some("op.already_decided")
    );
    m.handle(
        RunInput::Call {
            frame: None,
            call: call(json!({"_tool": "act", "v": "†state.later"})).into(),
            parsed: Default::default(),
        },
        3,
    );
    assert!(matches!(m.check_op(&decide(2, Decision::Approve, None)),
        Err(OpError::NotAwaiting { status, .. }) if status == "blocked"));
    m.handle(
        RunInput::Cancel {
            reason: "done".into(),
            by: None,
        },
        4,
    );
    assert_eq!(
        code(&m, decide(2, Decision::Approve, None)),
        Some("op.run_finished")
    );
}

#[test]
fn the_same_journal_gives_the_same_events() {
    let journal: Vec<JournalEntry> = [
        RunInput::Start,
        RunInput::Call {
            frame: None,
            call: call(json!({"_tool": "note", "_output": "x", "_outputPath": "†state.a"})).into(),
            parsed: Default::default(),
        },
        RunInput::Call {
            frame: None,
            call: call(json!({"_tool": "act", "v": "†state.a"})).into(),
            parsed: Default::default(),
        },
        RunInput::StreamClosed {
            frame: None,
            error: None,
            finish_reason: None,
        },
        RunInput::Outcome {
            call: CallId(2),
            outcome: crate::scheduler::Outcome::ok(json!(1)),
        },
    ]
    .into_iter()
    .enumerate()
    .map(|(i, input)| JournalEntry {
        seq: i as u64 + 1,
        at: i as u64 * 10,
        input,
    })
    .collect();
    let cfg = config(json!({}));
    let a = replay(
        "r",
        cfg.clone(),
        Policy::auto(),
        SanitizeLimits::default(),
        &journal,
    );
    let b = replay(
        "r",
        cfg,
        Policy::auto(),
        SanitizeLimits::default(),
        &journal,
    );
    assert_eq!(a, b);
    let seqs: Vec<u64> = a.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (1..=a.len() as u64).collect::<Vec<_>>(),
        "numbered without gaps"
    );
    assert!(
        a.iter()
            .any(|e| e.kind.name() == "request_started" && e.step == 2)
    );
}

#[test]
fn an_interrupted_call_reruns_when_idempotent_and_is_presented_again_otherwise() {
    // What a lost activity becomes (Temporal: the worker running it died).
    let tools = json!({"tools": [
        {"_tool": "again", "_activity": "rust", "_idempotent": true, "type": "object"},
        {"_tool": "once", "_activity": "rust", "type": "object"}]});
    let mut m = machine(tools, Policy::auto());
    // A machine whose launched calls can be lost keeps them (the workflow's does).
    m.keep_launched(true);
    m.handle(RunInput::Start, 0);
    let a = turn(
        &mut m,
        &[json!({"_tool": "again"}), json!({"_tool": "once"})],
        Value::Null,
        1,
    );
    let launched = |a: &[Action], n: u64| {
        a.iter()
            .filter(|x| matches!(x, Action::Launch { id, .. } if *id == CallId(n)))
            .count()
    };
    assert_eq!((launched(&a, 1), launched(&a, 2)), (1, 1));
    let a = m.handle(RunInput::Interrupted { call: CallId(1) }, 2);
    assert_eq!(launched(&a, 1), 1, "the idempotent call runs again: {a:?}");
    let a = m.handle(RunInput::Interrupted { call: CallId(2) }, 3);
    assert_eq!(launched(&a, 2), 0, "{a:?}");
    assert!(
        a.iter().any(|x| matches!(x, Action::Emit(e)
            if matches!(&e.kind, crate::protocol::EventKind::ApprovalRequested { interrupted: true, .. }))),
        "the other goes back to a reviewer, flagged, whatever the policy: {a:?}"
    );
}

#[test]
fn the_machine_keeps_its_pending_timers_and_the_requests_each_model_answered() {
    let mut m = machine(json!({"limits": {"timeout_s": 2}}), Policy::auto());
    assert_eq!(m.poll_timeout(), None);
    m.handle(RunInput::Start, 1000);
    let deadline = Timer::Deadline { frame: None };
    assert_eq!(m.timers().collect::<Vec<_>>(), vec![(deadline, 3000)]);
    assert_eq!(m.poll_timeout(), Some(3000));
    // The first turn streams: not yet answered (it is asked again after a restart).
    let counts = |m: &RunMachine| -> Vec<(usize, usize, usize)> {
        m.requests()
            .into_iter()
            .map(|((_, i), r)| (i, r.made, r.answered()))
            .collect()
    };
    assert_eq!(counts(&m), vec![(0, 1, 0)]);
    // A retry inside the turn asked the model once more.
    m.handle(
        RunInput::Retry {
            frame: None,
            attempt: 1,
            status: Some(503),
            wait_ms: 10,
            error: "busy".into(),
        },
        1100,
    );
    // Asked twice so far, the turn streaming now included (what Temporal's turn activity
    // reads); answered once.
    assert_eq!(counts(&m), vec![(0, 2, 1)]);
    assert!(m.requests().iter().all(|((list, _), _)| list.is_none()));
    // A turn that ends asks the next one (counted once it has streamed).
    turn(
        &mut m,
        &[json!({"_tool": "note", "_output": "x"})],
        Value::Null,
        1200,
    );
    assert_eq!(counts(&m), vec![(0, 3, 2)]);
    // A fired timer is no longer pending.
    m.handle(RunInput::TimerFired { timer: deadline }, 3000);
    assert_eq!(m.timers().count(), 0);
    assert_eq!(m.poll_timeout(), None);
}


#[test]
fn a_reviewers_call_is_checked_as_written_with_its_references_deferred() {
    let tools = json!({"tools": [
        {"_tool": "note", "_output": {"type": "string"}},
        {"_tool": "act", "_activity": "rust", "type": "object",
         "properties": {"x": {"type": "integer"}, "why": {"type": "string"}},
         "required": ["x", "why"]}
    ]});
    let mut m = machine(tools, Policy::ask());
    m.handle(RunInput::Start, 0);
    m.handle(
        RunInput::Call {
            frame: None,
            call: call(json!({"_tool": "act", "x": 1, "why": "w"})).into(),
            parsed: Default::default(),
        },
        1,
    );
    let edit = |params: Value| Op::Decide {
        call: CallId(1),
        decision: Decision::Edit {
            params: params.as_object().cloned().unwrap_or_default(),
        },
        presented: None,
        presentation: None,
        by: None,
    };
    let code = |op: Op| m.check_op(&op).err().map(|e| e.code());
    // A reference stands in for the required integer: checked once resolved.
    assert_eq!(code(edit(json!({"x": "†state.x", "why": "w"}))), None);
    // Beside a reference, a literal that breaks the schema is refused now (it used to pass
    // until the call ran, because the whole check was skipped when any reference was there).
    assert_eq!(
        code(edit(json!({"x": "†state.x", "why": 5}))),
        Some("op.invalid_decision")
    );
    assert_eq!(code(edit(json!({"x": "one", "why": "w"}))), Some("op.invalid_decision"));
}

/// The seq of the latest `approval_requested` event for `call` among `actions`.
fn presented_at(actions: &[Action], call: u64) -> Option<u64> {
    actions.iter().rev().find_map(|a| match a {
        Action::Emit(e)
            if e.call == Some(CallId(call))
                && matches!(e.kind, crate::protocol::EventKind::ApprovalRequested { .. }) =>
        {
            Some(e.seq)
        }
        _ => None,
    })
}

#[test]
fn a_decision_answers_the_presentation_it_names_and_never_a_later_one() {
    // DESIGN.md 3.6: every approval request is a presentation (its event's seq); a decision
    // names one; a re-presentation (a call interrupted by a restart) is a new request.
    let mut m = machine(json!({}), Policy::ask());
    m.keep_launched(true);
    m.handle(RunInput::Start, 0);
    let a = turn(&mut m, &[json!({"_tool": "act", "x": 1})], Value::Null, 1);
    let first = presented_at(&a, 1).expect("presented");
    assert_eq!(m.presentation(CallId(1)), Some(first));
    let decide = |presentation: Option<u64>, by: &str| Op::Decide {
        call: CallId(1),
        decision: Decision::Approve,
        presented: None,
        presentation,
        by: Some(crate::protocol::Actor::new(by, crate::protocol::Actor::HTTP)),
    };
    // A presentation that is not the current one is refused; the current one applies.
    assert!(matches!(m.check_op(&decide(Some(first + 1), "x")),
        Err(OpError::StalePresentation { presented, current, .. }) if presented == first + 1 && current == first));
    assert_eq!(
        m.check_op(&decide(Some(first + 1), "x"))
            .err()
            .map(|e| e.code()),
        Some("op.stale_presentation")
    );
    assert_eq!(m.check_op(&decide(Some(first), "alice")), Ok(()));
    // An older client's decision names none: it is bound to the one its check saw.
    let bound = m.bind_op(decide(None, "alice")).expect("applies");
    assert!(matches!(bound, Op::Decide { presentation: Some(p), .. } if p == first));
    let a = m.handle(RunInput::from_op(bound), 2);
    assert!(
        a.iter()
            .any(|x| matches!(x, Action::Launch { id, .. } if *id == CallId(1))),
        "{a:?}"
    );
    // A second decision about that presentation names the first.
    assert!(matches!(m.check_op(&decide(Some(first), "bob")),
        Err(OpError::AlreadyDecided { decision, by: Some(b), .. }) if decision == "approve" && b == "alice"));
    // The process stops while the call runs: the rebuilt run presents it again, a new
    // request that no decision given before answers.
    let a = m.handle(RunInput::Resumed, 3);
    let second = presented_at(&a, 1).expect("presented again");
    assert!(second > first);
    assert_eq!(m.presentation(CallId(1)), Some(second));
    assert!(matches!(
        m.check_op(&decide(Some(first), "bob")),
        Err(OpError::StalePresentation { current, .. }) if current == second
    ));
    // A journaled decision for the old presentation changes nothing (nothing runs).
    let stale = RunInput::Decided {
        call: CallId(1),
        decision: Decision::Approve,
        by: None,
        presentation: Some(first),
    };
    let a = m.handle(stale, 4);
    assert!(
        !a.iter().any(|x| matches!(x, Action::Launch { .. })),
        "{a:?}"
    );
    assert_eq!(m.presentation(CallId(1)), Some(second));
    // A dropped decision is on the record, and changes nothing either.
    let a = m.handle(
        RunInput::Dropped {
            call: CallId(1),
            decision: Decision::Approve,
            by: None,
            presentation: Some(first),
            code: "op.stale_presentation".into(),
        },
        5,
    );
    assert!(
        a.iter().any(|x| matches!(x, Action::Emit(e)
            if matches!(&e.kind, crate::protocol::EventKind::DecisionDropped { presentation: Some(p), .. } if *p == first))),
        "{a:?}"
    );
    assert!(!a.iter().any(|x| matches!(x, Action::Launch { .. })));
    // The new presentation takes a new decision.
    assert_eq!(m.check_op(&decide(Some(second), "carol")), Ok(()));
    // An old journal's decision (no presentation) still replays as it did.
    let a = m.handle(
        RunInput::Decided {
            call: CallId(1),
            decision: Decision::Approve,
            by: None,
            presentation: None,
        },
        6,
    );
    assert!(
        a.iter()
            .any(|x| matches!(x, Action::Launch { id, .. } if *id == CallId(1))),
        "{a:?}"
    );
    assert_eq!(m.presentation(CallId(1)), None);
}
