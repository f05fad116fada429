//! Workflow histories recorded by an earlier dagloop (commit e7f36d5, fixtures in
//! `tests/fixtures/temporal/`) replay through this build's workflow (feature `temporal`;
//! spec/temporal-versions.md). Needs no server: the SDK's replayer runs the workflow's code
//! against the recorded events, and fails on the first command the code disagrees with.
#![cfg(feature = "temporal")]

use std::path::Path;

use serde_json::Value;

/// A fixture's bytes and its events.
fn fixture(name: &str) -> (Vec<u8>, Vec<Value>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/temporal")
        .join(format!("{name}.history.json"));
    let bytes = std::fs::read(&path).expect("fixture");
    let v: Value = serde_json::from_slice(&bytes).expect("history JSON");
    let events = v["events"].as_array().expect("events").clone();
    (bytes, events)
}

/// The attributes of the events named `kind` (`TimerStartedEventAttributes`, ...), in order.
fn attributes<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter_map(|e| e["attributes"].get(kind))
        .collect()
}

/// The size of the (base64) payload data under `field` of an event's attributes.
fn payload_chars(attrs: &Value, field: &str) -> usize {
    attrs[field]["payloads"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["data"].as_str())
        .map(str::len)
        .sum()
}

async fn replays(name: &str, history: &[u8]) {
    dagloop::temporal::replay(history)
        .await
        .unwrap_or_else(|e| panic!("{name}, recorded at e7f36d5, does not replay: {e}"));
}

/// The activity ids scheduled, in order (`turn-...`, `call-1`, ...).
fn scheduled(events: &[Value]) -> Vec<String> {
    attributes(events, "ActivityTaskScheduledEventAttributes")
        .iter()
        .filter_map(|a| a["activity_id"].as_str().map(String::from))
        .collect()
}

/// TV3: a run recorded before the `timers-in-machine` patch continued as new while it waited
/// for a reviewer with its run deadline (`limits.timeout_s: 5`) armed. This is the history of
/// the execution it continued as: the deadline re-armed as a workflow timer before anything
/// else (the old path: one per machine timer), the reviewer's approval by update, the call
/// started, the deadline fired while the call ran and the run ended `timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_that_continued_as_new_with_a_timer_armed_replays() {
    let name = "continued_deadline";
    let (history, events) = fixture(name);
    let started = attributes(&events, "WorkflowExecutionStartedEventAttributes");
    let from = started[0]["continued_execution_run_id"].as_str();
    assert!(
        from.is_some_and(|r| !r.is_empty()),
        "{name} did not continue"
    );
    let kinds: Vec<u64> = events
        .iter()
        .filter_map(|e| e["event_type"].as_u64())
        .collect();
    // As recorded: the timer (17) started before the call was scheduled (10), and fired (18).
    let first = |k: u64| kinds.iter().position(|x| *x == k).expect("event kind");
    assert!(first(17) < first(10), "{name}: {kinds:?}");
    assert!(first(10) < first(18), "{name}: {kinds:?}");
    replays(name, &history).await;
}

/// TV4: a run recorded before the `result-bound` patch under `kept_result_bytes = 1024`, whose
/// first call's result (4 KiB) is over that bound: the build that recorded it kept the result
/// whole, so the call after it (`after: †state.a`) ran. It replays on this build only because
/// the workflow takes the old path for it: bounded, call 1 would have failed `run.result_bound`
/// and call 2 never been scheduled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_with_a_result_over_the_bound_recorded_before_the_patch_replays() {
    let name = "result_over_bound";
    let (history, events) = fixture(name);
    let biggest = attributes(&events, "ActivityTaskCompletedEventAttributes")
        .iter()
        .map(|a| payload_chars(a, "result"))
        .max()
        .unwrap_or(0);
    // 4 KiB of result, in base64: well over the 1,024 bytes the run's record bounds it to.
    assert!(
        biggest > 4 * 1024,
        "{name}: the largest result is {biggest} chars"
    );
    let calls: Vec<String> = scheduled(&events)
        .into_iter()
        .filter(|id| id.starts_with("call-"))
        .collect();
    assert_eq!(calls, ["call-1", "call-2"], "{name}");
    replays(name, &history).await;
}
