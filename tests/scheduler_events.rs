//! Snapshot of the event log of a representative step: a fetch feeding a latent summary and an
//! approved send, a failing call with a failure branch, a cycle refusal and an unresolved call.
//! The step is the first of a real run (`common::run`), so the log is the run's: it starts with
//! `run_started` and `request_started` and ends with the step that closes the run (`solution`,
//! a second `request_started`, `run_finished`); call ids are the run's (from `c1`), and the
//! first state write (`write_seq` 0) is the goal's initial state. Times are virtual
//! milliseconds since the run started (tokio's paused clock).

#[path = "common/sched.rs"]
mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use dagloop::approval::{Policy, ScriptedApprover, after};
use dagloop::protocol::Decision;
use serde_json::json;
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn representative_event_log() {
    let exec = TestExec::new(Instant::now())
        .with(
            "fetchUser",
            Behaviour::Sleep(20, Some(json!({"name": "Ada", "plan": "pro"}))),
        )
        .with(
            "chargeCard",
            Behaviour::Fail(5, json!({"error": "card declined"})),
        )
        .with(
            "sendEmail",
            Behaviour::Sleep(10, Some(json!({"sent": true}))),
        );
    let approver = Arc::new(ScriptedApprover::new().for_tool(
        "sendEmail",
        after(Duration::from_millis(7), Decision::Approve),
    ));
    let mut step = Step::new(vec![
        tool("fetchUser"),
        latent("summarize"),
        tool("chargeCard"),
        tool("sendEmail"),
    ])
    .at(
        0,
        json!({"_tool": "fetchUser", "id": "u1", "_outputPath": "†state.user"}),
    )
    .at(
        2,
        json!({"_tool": "summarize", "user": "†state.user", "_output": "Ada is on pro",
                      "_outputPath": "†state.summary"}),
    )
    .at(
        4,
        json!({"_tool": "sendEmail", "body": "†state.summary", "to": "†state.user.name"}),
    )
    .at(
        6,
        json!({"_tool": "chargeCard", "_outputPath": "†state.charge || †state.chargeError"}),
    )
    .at(
        8,
        json!({"_tool": "sendEmail", "body": "†state.x", "_outputPath": "†state.y"}),
    )
    .at(
        8,
        json!({"_tool": "sendEmail", "body": "†state.y", "_outputPath": "†state.x"}),
    )
    .at(
        9,
        json!({"_tool": "sendEmail", "body": "†state.neverWritten"}),
    );
    step.policy = Policy::allowlist(["fetchUser", "chargeCard"]);
    step.approver = approver;
    step.close_at = Some(12);
    let o = run(step, exec).await;
    let lines: Vec<String> = o
        .events
        .iter()
        .map(|e| serde_json::to_string(e).expect("event json"))
        .collect();
    insta::assert_snapshot!(lines.join("\n"));
}
