//! The approval gate (rules 13-14), driven end to end on tokio's paused clock: each test is one
//! step of a real run (`common::run`), its reviewer answering through the run's approval gate.
//! Call ids are the run's, so the first call of the step is `c1`.

#[path = "common/sched.rs"]
mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use dagloop::approval::{DefaultDecision, Policy, ScriptedApprover, after};
use dagloop::protocol::{CallId, Decision, EventKind, ToolApproval};
use dagloop::scheduler::CallStatus;
use serde_json::json;
use tokio::time::Instant;

fn params(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    v.as_object().cloned().unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn calls_are_presented_only_once_unblocked_with_resolved_params() {
    let approver = Arc::new(ScriptedApprover::new());
    let exec =
        TestExec::new(Instant::now()).with("fetch", Behaviour::Sleep(30, Some(json!("data"))));
    let mut step = Step::new(vec![tool("fetch"), tool("send")])
        .at(0, json!({"_tool": "fetch", "_outputPath": "†state.d"}))
        .at(0, json!({"_tool": "send", "body": "†state.d"}));
    step.policy = Policy::allowlist(["fetch"]);
    step.approver = approver.clone();
    let o = run(step, exec).await;
    let asked = approver.requests();
    assert_eq!(asked.len(), 1, "fetch is allowlisted; send asked once");
    assert_eq!(asked[0].id, CallId(2));
    assert_eq!(
        asked[0].call.params["body"],
        json!("data"),
        "resolved before presenting"
    );
    assert_eq!(o.run_of(2).start, 30);
    assert_eq!(
        o.kinds(2),
        vec![
            "call_received",
            "blocked",
            "unblocked",
            "approval_requested",
            "decision",
            "started",
            "finished"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn tool_overrides_beat_the_policy() {
    let approver = Arc::new(ScriptedApprover::new());
    let mut always = tool("wire");
    always.approval = Some(ToolApproval::Always);
    let mut never = tool("read");
    never.approval = Some(ToolApproval::Never);
    let mut step = Step::new(vec![always, never, tool("other")])
        .at(0, json!({"_tool": "wire"}))
        .at(0, json!({"_tool": "read"}))
        .at(0, json!({"_tool": "other"}));
    step.policy = Policy::allowlist(["wire"]);
    step.approver = approver.clone();
    run(step, TestExec::new(Instant::now())).await;
    let asked: Vec<String> = approver
        .requests()
        .iter()
        .map(|r| r.tool.name.clone())
        .collect();
    assert_eq!(asked, vec!["wire", "other"]);
}

#[tokio::test(start_paused = true)]
async fn edit_that_adds_a_dependency_waits_then_runs_without_asking_again() {
    let approver = Arc::new(ScriptedApprover::new().for_tool(
        "send",
        Decision::Edit {
            params: params(json!({"body": "†state.late", "_outputPath": "†state.sent"})),
        },
    ));
    let exec =
        TestExec::new(Instant::now()).with("slow", Behaviour::Sleep(50, Some(json!("late value"))));
    let mut step = Step::new(vec![tool("slow"), tool("send")])
        .at(0, json!({"_tool": "slow", "_outputPath": "†state.late"}))
        .at(0, json!({"_tool": "send", "body": "draft"}));
    step.policy = Policy::allowlist(["slow"]);
    step.approver = approver.clone();
    let o = run(step, exec).await;
    assert_eq!(approver.requests().len(), 1, "not presented a second time");
    let send = o.run_of(2);
    assert_eq!(send.start, 50, "blocked again until state.late was written");
    assert_eq!(send.params["body"], json!("late value"));
    assert!(
        o.get("state.sent").is_some(),
        "meta fields in the edit apply"
    );
    // The run's call summary holds neither call: the call as written is its `call_received`
    // event's, the revision its `decision` event's.
    assert_eq!(
        o.received(2).map(|c| c.params["body"].clone()),
        Some(json!("draft"))
    );
    let Some(Decision::Edit { params: revised }) = o.decision(2) else {
        panic!("an edit: {:?}", o.decision(2))
    };
    assert_eq!(revised["body"], json!("†state.late"));
    assert_eq!(
        o.kinds(2),
        vec![
            "call_received",
            "approval_requested",
            "decision",
            "blocked",
            "unblocked",
            "started",
            "finished",
            "written"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn replace_runs_a_different_call_in_the_same_place() {
    let approver = Arc::new(ScriptedApprover::new().then(Decision::Replace {
        call: Box::new(call(
            json!({"_tool": "safe", "mode": "dry-run", "_outputPath": "†state.out"}),
        )),
    }));
    let mut step = Step::new(vec![tool("risky"), tool("safe")]).at(0, json!({"_tool": "risky"}));
    step.policy = Policy::ask();
    step.approver = approver.clone();
    let o = run(step, TestExec::new(Instant::now())).await;
    assert_eq!(o.runs.len(), 1);
    assert_eq!((o.runs[0].id, o.runs[0].tool.as_str()), (CallId(1), "safe"));
    assert!(o.get("state.out").is_some());
    let rep = o.report.get(CallId(1)).expect("c1");
    assert_eq!(rep.status, CallStatus::Done);
    // The run's call summary names the replacing tool (it holds no revised call); its
    // `decision` is the last one, the replacement's own approval, so the replacement is read
    // from the first `decision` event.
    assert_eq!(rep.tool, "safe");
    assert!(
        matches!(o.decision(1), Some(Decision::Replace { call }) if call.tool == "safe"),
        "{:?}",
        o.decision(1)
    );
    // Rule 21: the replacement is another tool, so its own policy applies: under `ask` it is
    // presented too (the scripted approver's fallback approves it).
    let asked: Vec<String> = approver
        .requests()
        .iter()
        .map(|r| r.call.tool.clone())
        .collect();
    assert_eq!(asked, vec!["risky", "safe"]);
}

#[tokio::test(start_paused = true)]
async fn a_replacement_by_an_allowed_tool_runs_without_asking_again() {
    let approver = Arc::new(ScriptedApprover::new().then(Decision::Replace {
        call: Box::new(call(json!({"_tool": "safe", "mode": "dry-run"}))),
    }));
    let mut step = Step::new(vec![tool("risky"), tool("safe")]).at(0, json!({"_tool": "risky"}));
    step.policy = Policy::allowlist(["safe"]);
    step.approver = approver.clone();
    let o = run(step, TestExec::new(Instant::now())).await;
    assert_eq!(o.runs.len(), 1);
    assert_eq!(o.runs[0].tool, "safe");
    assert_eq!(approver.requests().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn reject_tells_the_model_why_and_not_to_retry() {
    let approver = Arc::new(ScriptedApprover::new().for_tool(
        "refund",
        Decision::Reject {
            reason: "amount too high".into(),
        },
    ));
    let mut step = Step::new(vec![tool("refund"), tool("notify")])
        .at(
            0,
            json!({"_tool": "refund", "_outputPath": "†state.done || †state.refused"}),
        )
        .at(0, json!({"_tool": "notify", "v": "†state.done"}));
    step.policy = Policy::ask();
    step.approver = approver;
    let o = run(step, TestExec::new(Instant::now())).await;
    assert!(o.runs.is_empty());
    let rep = o.report.get(CallId(1)).expect("c1");
    assert_eq!(rep.status, CallStatus::Rejected);
    let err = rep.error.clone().expect("error");
    assert_eq!(
        (err["code"].clone(), err["details"]["retry"].clone()),
        (json!("approval.rejected"), json!(false))
    );
    assert!(
        err["message"]
            .as_str()
            .is_some_and(|s| s.contains("amount too high") && s.contains("Do not retry"))
    );
    assert_eq!(
        o.get("state.refused"),
        Some(err),
        "rule 12: rejection writes the failure branch"
    );
    assert_eq!(
        o.report.get(CallId(2)).map(|c| c.status),
        Some(CallStatus::Unresolved)
    );
}

#[tokio::test(start_paused = true)]
async fn reviewer_timeout_applies_the_policy_default() {
    for (default, status) in [
        (DefaultDecision::Reject, CallStatus::Rejected),
        (DefaultDecision::Approve, CallStatus::Done),
    ] {
        let approver = Arc::new(
            ScriptedApprover::new().then(after(Duration::from_secs(60), Decision::Approve)),
        );
        let mut step = Step::new(vec![tool("t")]).at(0, json!({"_tool": "t"}));
        step.policy = Policy::ask().with_timeout(Duration::from_secs(5), default);
        step.approver = approver;
        let o = run(step, TestExec::new(Instant::now())).await;
        assert_eq!(
            o.report.get(CallId(1)).map(|c| c.status),
            Some(status),
            "{default:?}"
        );
        let decision = o
            .events
            .iter()
            .find(|e| e.kind.name() == "decision")
            .expect("decision event");
        assert_eq!(decision.at, 5000);
        assert!(matches!(
            decision.kind,
            EventKind::Decision {
                timed_out: true,
                ..
            }
        ));
        // The policy's default decided, and the event says so (issue 24: every decision names
        // who made it).
        let EventKind::Decision { by, .. } = &decision.kind else {
            unreachable!()
        };
        assert_eq!(
            by.as_ref().map(|a| a.channel.as_str()),
            Some("timeout"),
            "{decision:?}"
        );
        assert!(
            o.elapsed < 6000,
            "did not wait for the late answer: {}",
            o.elapsed
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_slow_decision_does_not_hold_up_other_calls() {
    let approver = Arc::new(
        ScriptedApprover::new()
            .for_tool("slowly", after(Duration::from_secs(10), Decision::Approve))
            .for_tool("quickly", after(Duration::from_secs(1), Decision::Approve)),
    );
    let mut step = Step::new(vec![tool("slowly"), tool("quickly"), tool("auto")])
        .at(0, json!({"_tool": "slowly"}))
        .at(0, json!({"_tool": "quickly", "_outputPath": "†state.q"}))
        .at(0, json!({"_tool": "auto", "v": "†state.q"}));
    step.policy = Policy::allowlist(["auto"]);
    step.approver = approver;
    let o = run(step, TestExec::new(Instant::now())).await;
    assert_eq!(
        o.run_of(2).start,
        1000,
        "asked concurrently with the slow one"
    );
    assert_eq!(o.run_of(3).start, 1010);
    assert_eq!(o.run_of(1).start, 10_000);
}

// Spec A3: an edit that does not form a valid call is refused. Through a run it is the reviewer's
// `Decide` op that is refused (`op.invalid_decision`: rule 21, nothing invalid is journaled), so
// a remote reviewer can answer again; an in-process reviewer will not, so its adapter rejects the
// call with the refusal as the reason instead of leaving it waiting forever.
#[tokio::test(start_paused = true)]
async fn a_bad_edit_from_an_in_process_reviewer_rejects_the_call_with_the_reason() {
    let approver = Arc::new(ScriptedApprover::new().then(Decision::Edit {
        params: params(json!({"_outputMethod": "sideways"})),
    }));
    let mut step = Step::new(vec![tool("t")]).at(0, json!({"_tool": "t"}));
    step.policy = Policy::ask();
    step.approver = approver;
    let o = run(step, TestExec::new(Instant::now())).await;
    assert!(o.runs.is_empty(), "the call never ran");
    let rep = o.report.get(CallId(1)).expect("c1");
    assert_eq!(rep.status, CallStatus::Rejected);
    let err = rep.error.clone().expect("error");
    assert_eq!(err["code"], json!("approval.rejected"));
    let reason = err.to_string();
    assert!(
        reason.contains("could not be applied") && reason.contains("sideways"),
        "{reason}"
    );
}

#[tokio::test(start_paused = true)]
async fn cancelling_while_a_reviewer_thinks_cancels_the_call() {
    let approver =
        Arc::new(ScriptedApprover::new().then(after(Duration::from_secs(60), Decision::Approve)));
    let mut step = Step::new(vec![tool("t")]).at(0, json!({"_tool": "t"}));
    step.policy = Policy::ask();
    step.approver = approver;
    step.cancel_at = Some(100);
    let o = run(step, TestExec::new(Instant::now())).await;
    assert_eq!(o.elapsed, 100);
    assert_eq!(
        o.report.get(CallId(1)).map(|c| c.status),
        Some(CallStatus::Cancelled)
    );
    assert!(o.runs.is_empty());
}
