//! Sans-IO tests: inputs in, actions out, no runtime.

use super::*;
use crate::protocol::{EventKind, PathText};
use serde_json::json;

fn tool(name: &str) -> Tool {
    let mut t = Tool::new(name);
    t.activity = Some("test".into());
    t
}

fn call(v: Value) -> Call {
    Call::try_from(v).expect("call")
}

fn sched() -> Scheduler {
    Scheduler::new(
        State::new(),
        vec![tool("t")],
        Policy::auto(),
        SchedulerOptions {
            step: 4,
            ..SchedulerOptions::default()
        },
    )
}

/// The next call, numbered from 100 in arrival order.
fn arrival(s: &Scheduler, c: Call) -> Input {
    Input::CallArrived {
        id: CallId(100 + s.len() as u64),
        parsed: Parsed::of(&c),
        call: Ok(c.into()),
    }
}

fn launches(actions: &[Action]) -> Vec<CallId> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Launch { id, .. } => Some(*id),
            _ => None,
        })
        .collect()
}

#[test]
fn status_names_are_their_serialised_form() {
    let all = [
        CallStatus::Pending,
        CallStatus::Running,
        CallStatus::Done,
        CallStatus::Failed,
        CallStatus::Rejected,
        CallStatus::Unresolved,
        CallStatus::Cancelled,
        CallStatus::Refused,
        CallStatus::Detached,
    ];
    for s in all {
        assert_eq!(serde_json::to_value(s).expect("status"), json!(s.as_str()));
    }
}

#[test]
fn ids_are_the_callers_and_launch_is_immediate() {
    let mut s = sched();
    let a = s.handle(arrival(&s, call(json!({"_tool": "t"}))), 1);
    assert_eq!(launches(&a), vec![CallId(100)]);
    assert_eq!(s.len(), 1);
    assert_eq!(s.step(), 4);
    assert_eq!(s.counts(), (0, 0, 1));
}

#[test]
fn completion_rechecks_only_the_readers_of_what_was_written() {
    let n = 2000u64;
    let mut s = sched();
    let mut out = Vec::new();
    s.handle_into(
        arrival(
            &s,
            call(json!({"_tool": "t", "_outputPath": "†state.root"})),
        ),
        0,
        &mut out,
    );
    for i in 0..n {
        let c = call(
            json!({"_tool": "t", "r": "†state.root", "_outputPath": format!("†state.mid.k{i}")}),
        );
        s.handle_into(arrival(&s, c), 0, &mut out);
    }
    s.handle_into(
        arrival(&s, call(json!({"_tool": "t", "all": "†state.mid"}))),
        0,
        &mut out,
    );
    s.handle_into(Input::StreamClosed, 0, &mut out);
    let before = s.resolutions();
    out.clear();
    s.handle_into(
        Input::Finished {
            id: CallId(100),
            outcome: Outcome::ok(json!(1)),
        },
        1,
        &mut out,
    );
    assert_eq!(launches(&out).len() as u64, n);
    for i in 0..n {
        out.clear();
        s.handle_into(
            Input::Finished {
                id: CallId(101 + i),
                outcome: Outcome::ok(json!(i)),
            },
            2,
            &mut out,
        );
    }
    let sink = CallId(101 + n);
    assert_eq!(launches(&out), vec![sink]);
    // One full resolution per mid when the root finished, and one for the sink when its last
    // producer finished: the sink's earlier rechecks stop at its first still-blocked path.
    assert_eq!(s.resolutions() - before, n + 1);
}

#[test]
fn stale_and_foreign_inputs_are_ignored() {
    let mut s = sched();
    s.handle(arrival(&s, call(json!({"_tool": "t"}))), 0);
    assert!(
        s.handle(
            Input::Finished {
                id: CallId(7),
                outcome: Outcome::ok(json!(1))
            },
            0
        )
        .is_empty()
    );
    assert!(
        s.handle(
            Input::Decided {
                id: CallId(100),
                decision: crate::protocol::Decision::Approve
            },
            0
        )
        .is_empty()
    );
    assert!(
        s.handle(Input::ApprovalTimedOut { id: CallId(100) }, 0)
            .is_empty()
    );
    let a = s.handle(Input::StreamClosed, 0);
    assert!(a.is_empty(), "still running: {a:?}");
    let a = s.handle(
        Input::Finished {
            id: CallId(100),
            outcome: Outcome::ok(json!(1)),
        },
        0,
    );
    assert_eq!(a.last(), Some(&Action::Drained));
    assert!(s.is_drained());
    assert!(
        s.handle(arrival(&s, call(json!({"_tool": "t"}))), 0)
            .is_empty()
    );
}

#[test]
fn cancel_aborts_running_and_drains_even_with_the_stream_open() {
    let mut s = sched();
    s.handle(
        arrival(&s, call(json!({"_tool": "t", "_outputPath": "†state.a"}))),
        0,
    );
    s.handle(arrival(&s, call(json!({"_tool": "t", "v": "†state.a"}))), 0);
    let a = s.handle(Input::Cancel, 5);
    assert_eq!(a[0], Action::Abort { id: CallId(100) });
    assert_eq!(a.last(), Some(&Action::Drained));
    let cancelled = a
        .iter()
        .filter(|x| {
            matches!(
                x,
                Action::Event {
                    kind: EventKind::Cancelled,
                    ..
                }
            )
        })
        .count();
    assert_eq!(cancelled, 2);
    assert_eq!(s.report().count(CallStatus::Cancelled), 2);
    assert!(s.graph().is_empty());
}

#[test]
fn the_same_inputs_give_the_same_actions() {
    let script = || {
        let mut s = sched();
        let mut all = Vec::new();
        for c in [
            json!({"_tool": "t", "v": "†state.b", "_outputPath": "†state.c"}),
            json!({"_tool": "t", "_outputPath": "†state.b"}),
            json!({"_tool": "t", "v": "†state.c && †state.b"}),
        ] {
            all.extend(s.handle(arrival(&s, call(c)), 3));
        }
        all.extend(s.handle(Input::StreamClosed, 4));
        all.extend(s.handle(
            Input::Finished {
                id: CallId(101),
                outcome: Outcome::ok(json!(2)),
            },
            5,
        ));
        all.extend(s.handle(
            Input::Finished {
                id: CallId(100),
                outcome: Outcome::ok(json!(3)),
            },
            6,
        ));
        all.extend(s.handle(
            Input::Finished {
                id: CallId(102),
                outcome: Outcome::ok(json!(4)),
            },
            7,
        ));
        all
    };
    let (a, b) = (script(), script());
    assert_eq!(a, b);
    assert_eq!(a.last(), Some(&Action::Drained));
}

/// A result is kept once: the `finished` event, the state's writes (both paths of an `&&`
/// target) and the step report hold the outcome's own allocation.
#[test]
fn a_result_is_one_allocation_shared_by_its_event_state_and_report() {
    let mut s = sched();
    let mut out = Vec::new();
    s.handle_into(
        arrival(
            &s,
            call(json!({"_tool": "t", "_outputPath": "†state.a && †state.b"})),
        ),
        0,
        &mut out,
    );
    s.handle_into(Input::StreamClosed, 0, &mut out);
    let outcome = Outcome::ok(json!({"blob": "x".repeat(10_000)}));
    let Ok(result) = outcome.result.clone() else {
        panic!("ok outcome");
    };
    out.clear();
    s.handle_into(
        Input::Finished {
            id: CallId(100),
            outcome,
        },
        1,
        &mut out,
    );
    let event = out
        .iter()
        .find_map(|a| match a {
            Action::Event {
                kind: EventKind::Finished { result },
                ..
            } => Some(result.clone()),
            _ => None,
        })
        .expect("a finished event");
    assert!(Arc::ptr_eq(&event, &result), "the event shares the outcome");
    let (state, report) = s.finish();
    assert_eq!(state.log().len(), 2);
    for w in state.log() {
        assert!(Arc::ptr_eq(&w.value, &result), "{} shares it", w.path);
    }
    let reported = report.calls[0].result.clone().expect("a result");
    assert!(Arc::ptr_eq(&reported, &result), "the report shares it");
}

/// The typed reasons print as the strings they replaced, and the refusal keeps its code.
#[test]
fn typed_reasons_keep_their_messages_and_codes() {
    let unreadable = SchedulerError::Unreadable {
        reason: UnreadableCall::new("missing `_tool`").received("`{\"x\": 1}`"),
        known: "a, b".into(),
    };
    assert_eq!(unreadable.code(), "scheduler.unreadable_call");
    assert!(unreadable.to_string().starts_with(
        "the call could not be read: missing `_tool`; received `{\"x\": 1}`; a call is"
    ));
    let violation = |pointer: &str, message: &str| crate::schema::Violation {
        pointer: pointer.into(),
        schema_pointer: String::new(),
        keyword: "type".into(),
        message: message.into(),
    };
    let bad = SchedulerError::InvalidParams {
        tool: "t".into(),
        reason: ValidationError::Violations {
            violations: vec![violation("/n", "not a number"), violation("", "too many")],
        },
    };
    assert_eq!(
        bad.to_value(),
        json!({"code": "scheduler.invalid_params",
               "message": "invalid params for `t`: at /n: not a number; at the root: too many"})
    );
    let edit = SchedulerError::BadEdit {
        reason: EditError::ChangesTool {
            tool: "t".into(),
            requested: "u".into(),
        },
    };
    assert_eq!(
        edit.to_value(),
        json!({"code": "approval.bad_edit",
               "message": "the reviewer's edit does not form a valid call: an edit keeps the tool `t` (changing the tool is a replace)"})
    );
}

#[test]
fn an_unreadable_call_is_refused_with_its_reason_and_what_was_received() {
    let mut s = sched();
    s.handle(
        Input::CallArrived {
            id: CallId(1),
            call: Err(UnreadableCall::new("not an object").received("`42`")),
            parsed: Parsed::default(),
        },
        0,
    );
    let r = s.report();
    let c = r.get(CallId(1)).expect("c1");
    assert_eq!(c.status, CallStatus::Refused);
    let e = c.error.as_deref().expect("error");
    assert_eq!(e["code"], json!("scheduler.unreadable_call"));
    assert_eq!(
        e["message"],
        json!(
            "the call could not be read: not an object; received `42`; a call is an object {\"_tool\": \"<tool name>\", <params>...} naming one of the tools (t)"
        )
    );
}

#[test]
fn a_launch_shares_its_call_with_the_started_event() {
    let mut s = sched();
    let out = s.handle(
        arrival(&s, call(json!({"_tool": "t", "n": 1, "deep": {"k": [1, 2]}}))),
        0,
    );
    let launched = out.iter().find_map(|a| match a {
        Action::Launch { call, .. } => Some(call.clone()),
        _ => None,
    });
    let started = out.iter().find_map(|a| match a {
        Action::Event {
            kind: EventKind::Started { tool, params, .. },
            ..
        } => Some((tool.clone(), params.clone())),
        _ => None,
    });
    let (Some(launched), Some((tool, started))) = (launched, started) else {
        panic!("a launch and a started event: {out:?}");
    };
    assert!(started.is_of(&launched), "the event copied the params");
    // The tool name too is the launched call's own, not a copy, and serialises as the name.
    assert!(tool.is_of(&launched), "the event copied the tool name");
    assert_eq!(&*tool, "t");
    let name = serde_json::to_value(&tool).expect("serialise the name");
    assert_eq!(name, json!("t"));
    let back: crate::protocol::LaunchedTool = serde_json::from_value(name).expect("the name");
    assert_eq!(back, tool);
    assert_eq!(started.as_map(), &launched.params);
    assert_eq!(started.get("n"), Some(&json!(1)), "reads as the params object");
    // The event reads and serialises as the params object, as before it shared them.
    let text = serde_json::to_value(&started).expect("serialise");
    assert_eq!(text, json!({"n": 1, "deep": {"k": [1, 2]}}));
    let back: crate::protocol::LaunchedParams =
        serde_json::from_value(text).expect("deserialise");
    assert_eq!(back, started);
}

/// The path texts events carry: (written paths, blocked `waiting_on`, unresolved `missing`).
type Named = (Vec<PathText>, Vec<PathText>, Vec<PathText>);

fn named(out: &[Action]) -> Named {
    let mut n: Named = Default::default();
    for a in out {
        match a {
            Action::Event {
                kind: EventKind::Written { path, .. },
                ..
            } => n.0.push(path.clone()),
            Action::Event {
                kind: EventKind::Blocked { waiting_on },
                ..
            } => n.1.extend(waiting_on.iter().cloned()),
            Action::Event {
                kind: EventKind::Unresolved { missing },
                ..
            } => n.2.extend(missing.iter().cloned()),
            _ => {}
        }
    }
    n
}

#[test]
fn events_naming_one_path_share_its_text() {
    let mut s = sched();
    let mut out = Vec::new();
    for c in [
        json!({"_tool": "t", "_outputPath": "†state.x", "_outputMethod": "push"}),
        json!({"_tool": "t", "_outputPath": "†state.x", "_outputMethod": "push"}),
        json!({"_tool": "t", "r": "†state.x", "m": "†state.gone"}),
    ] {
        s.handle_into(arrival(&s, call(c)), 0, &mut out);
    }
    for id in [100, 101] {
        s.handle_into(
            Input::Finished {
                id: CallId(id),
                outcome: Outcome::ok(json!(id)),
            },
            1,
            &mut out,
        );
    }
    s.handle_into(Input::StreamClosed, 2, &mut out);
    let (written, blocked, missing) = named(&out);
    assert_eq!(written, ["state.x", "state.x"], "{out:?}");
    assert_eq!(blocked, ["state.gone", "state.x"], "{out:?}");
    assert_eq!(missing, ["state.gone"], "{out:?}");
    // One text per path per run, rendered once: every event naming it holds the same one.
    assert!(written[0].shares(&written[1]), "each write rendered its path");
    assert!(blocked[1].shares(&written[0]));
    assert!(missing[0].shares(&blocked[0]));
    // And an event serialises its path as the plain string, as it did when it held a `String`.
    let w = out.iter().find_map(|a| match a {
        Action::Event {
            kind: k @ EventKind::Written { .. },
            ..
        } => Some(k.clone()),
        _ => None,
    });
    let w = serde_json::to_value(w.expect("a written event")).expect("serialise");
    assert_eq!(
        w,
        json!({"type": "written", "path": "state.x", "method": "push", "write_seq": 0})
    );
    let back: EventKind = serde_json::from_value(w).expect("deserialise");
    assert!(matches!(back, EventKind::Written { ref path, .. } if path == "state.x"));
    let b = serde_json::to_value(EventKind::Blocked {
        waiting_on: blocked,
    })
    .expect("serialise");
    assert_eq!(
        b,
        json!({"type": "blocked", "waiting_on": ["state.gone", "state.x"]})
    );
}

#[test]
fn a_chain_hop_walks_the_state_index_once() {
    let mut s = sched();
    let mut out = Vec::new();
    s.handle_into(
        arrival(&s, call(json!({"_tool": "t", "_outputPath": "†state.a"}))),
        0,
        &mut out,
    );
    s.handle_into(
        arrival(&s, call(json!({"_tool": "t", "x": "†state.a"}))),
        0,
        &mut out,
    );
    // The stream is still open: the second call waits on `state.a`, written by the first.
    assert!(launches(&out) == vec![CallId(100)], "{out:?}");
    let before = crate::state::PLANS.with(|n| n.get());
    out.clear();
    s.handle_into(
        Input::Finished {
            id: CallId(100),
            outcome: Outcome::ok(json!(1)),
        },
        1,
        &mut out,
    );
    assert_eq!(launches(&out), vec![CallId(101)]);
    // One read of `state.a`: the value it launches with, which also answered whether there is
    // one (no separate `has` before it).
    assert_eq!(crate::state::PLANS.with(|n| n.get()) - before, 1);
}

/// A call without references goes through the gate as written: the validator reads its params
/// in place (the very object the call holds, no copy), and when the policy asks, its
/// `approval_requested` event, the `Ask` action and the approved launch share that call.
#[test]
fn a_shared_call_is_validated_and_presented_in_place() {
    use std::sync::Mutex;
    let seen: Arc<Mutex<Vec<usize>>> = Arc::default();
    let record = seen.clone();
    let validate: Validator = Arc::new(move |_tool: &Tool, params: &Value| {
        if let Ok(mut s) = record.lock() {
            s.push(std::ptr::from_ref(params) as usize);
        }
        Ok(())
    });
    for (policy, asks) in [(Policy::auto(), false), (Policy::ask(), true)] {
        let mut s = Scheduler::new(
            State::new(),
            vec![tool("t")],
            policy,
            SchedulerOptions {
                step: 1,
                validate: Some(validate.clone()),
                ..SchedulerOptions::default()
            },
        );
        let written = Arc::new(call(json!({"_tool": "t", "n": 1, "deep": {"k": [1]}})));
        let mut out = s.handle(
            Input::CallArrived {
                id: CallId(1),
                parsed: Parsed::of(&written),
                call: Ok(written.clone()),
            },
            0,
        );
        let at = std::ptr::from_ref(written.params.as_value()) as usize;
        let recorded = seen.lock().map(|mut s| std::mem::take(&mut *s));
        assert_eq!(recorded.ok(), Some(vec![at]), "validated in place, once");
        if asks {
            let asked = out.iter().find_map(|a| match a {
                Action::Ask { call, .. } => Some(call.clone()),
                _ => None,
            });
            let event = out.iter().find_map(|a| match a {
                Action::Event {
                    kind: EventKind::ApprovalRequested { call, .. },
                    ..
                } => Some(call.clone()),
                _ => None,
            });
            let (Some(asked), Some(event)) = (asked, event) else {
                panic!("an Ask and its event: {out:?}");
            };
            assert!(Arc::ptr_eq(&asked, &written), "the Ask copied the call");
            assert!(Arc::ptr_eq(&event, &written), "the event copied the call");
            out = s.handle(
                Input::Decided {
                    id: CallId(1),
                    decision: crate::protocol::Decision::Approve,
                },
                1,
            );
        }
        let launched = out.iter().find_map(|a| match a {
            Action::Launch { call, .. } => Some(call.clone()),
            _ => None,
        });
        let Some(launched) = launched else {
            panic!("a launch: {out:?}");
        };
        assert!(Arc::ptr_eq(&launched, &written), "the launch copied the call");
    }
}
