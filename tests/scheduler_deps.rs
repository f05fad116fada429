//! Dependencies and scheduling (rules 3-12), driven end to end on tokio's paused clock: each
//! test is one step of a real run (`common::run`). Call ids are the run's, so the first call of
//! the step is `c1`.

#[path = "common/sched.rs"]
mod common;

use common::*;
use dagloop::protocol::{CallId, EventKind, FailKind, OutputMethod};
use dagloop::scheduler::CallStatus;
use serde_json::json;
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn diamond_runs_both_middles_in_parallel_and_joins() {
    let exec = TestExec::new(Instant::now())
        .with("a", Behaviour::Sleep(10, Some(json!(1))))
        .with("b", Behaviour::Sleep(30, Some(json!(2))))
        .with("c", Behaviour::Sleep(20, Some(json!(3))));
    let step = Step::new(vec![tool("a"), tool("b"), tool("c"), tool("d")])
        .at(
            0,
            json!({"_tool": "d", "x": "†state.b", "y": "†state.c", "_outputPath": "†state.d"}),
        )
        .at(
            0,
            json!({"_tool": "b", "a": "†state.a", "_outputPath": "†state.b"}),
        )
        .at(
            0,
            json!({"_tool": "c", "a": "†state.a", "_outputPath": "†state.c"}),
        )
        .at(0, json!({"_tool": "a", "_outputPath": "†state.a"}));
    let o = run(step, exec).await;
    let (a, b, c, d) = (o.run_of(4), o.run_of(2), o.run_of(3), o.run_of(1));
    assert_eq!(a.start, 0);
    assert_eq!(
        (b.start, c.start),
        (10, 10),
        "both middles start when a finishes"
    );
    assert_eq!(d.start, 40, "d waits for the slower middle");
    assert_eq!(
        d.params,
        json!({"x": 2, "y": 3})
            .as_object()
            .cloned()
            .unwrap_or_default()
    );
    assert_eq!(o.elapsed, 50);
    assert_eq!(o.report.count(CallStatus::Done), 4);
}

#[tokio::test(start_paused = true)]
async fn concurrent_writers_last_to_complete_wins_and_reader_waits_for_both() {
    let exec = TestExec::new(Instant::now())
        .with("slow", Behaviour::Sleep(30, Some(json!("slow"))))
        .with("fast", Behaviour::Sleep(10, Some(json!("fast"))));
    let step = Step::new(vec![tool("slow"), tool("fast"), tool("read")])
        .at(0, json!({"_tool": "slow", "_outputPath": "†state.x"}))
        .at(0, json!({"_tool": "fast", "_outputPath": "†state.x"}))
        .at(0, json!({"_tool": "read", "v": "†state.x"}));
    let o = run(step, exec).await;
    assert_eq!(o.run_of(3).start, 30, "the reader waits for both writers");
    assert_eq!(
        o.run_of(3).params["v"],
        json!("slow"),
        "completion order: slow finished last"
    );
    assert_eq!(o.get("state.x"), Some(json!("slow")));
    // The run's state log is not exposed; its `written` events are the writes in log order.
    assert_eq!(
        o.writes(),
        vec![(Some(CallId(2)), 10), (Some(CallId(1)), 30)],
        "rule 3: log in completion order; writes carry the completion time"
    );
}

#[tokio::test(start_paused = true)]
async fn reader_of_a_prefix_waits_for_a_pending_extension_write() {
    let exec = TestExec::new(Instant::now()).with("deep", Behaviour::Sleep(20, Some(json!(7))));
    let mut step = Step::new(vec![tool("deep"), tool("read")])
        .at(0, json!({"_tool": "deep", "_outputPath": "†state.a.b"}))
        .at(0, json!({"_tool": "read", "v": "†state.a"}));
    step.state.write(
        path("state.a"),
        json!({"old": true}),
        OutputMethod::Set,
        None,
        0,
    );
    let o = run(step, exec).await;
    assert_eq!(o.run_of(2).start, 20);
    assert_eq!(o.run_of(2).params["v"], json!({"old": true, "b": 7}));
}

#[tokio::test(start_paused = true)]
async fn fallback_takes_the_second_alternative_when_the_first_producer_fails() {
    let exec =
        TestExec::new(Instant::now()).with("flaky", Behaviour::Fail(10, json!({"error": "down"})));
    let mut step = Step::new(vec![tool("flaky"), tool("use")])
        .at(0, json!({"_tool": "flaky", "_outputPath": "†state.fresh"}))
        .at(
            0,
            json!({"_tool": "use", "v": "†state.fresh || †state.cached"}),
        );
    step.state.write(
        path("state.cached"),
        json!("cached"),
        OutputMethod::Set,
        None,
        0,
    );
    let o = run(step, exec).await;
    assert_eq!(o.run_of(2).start, 10);
    assert_eq!(o.run_of(2).params["v"], json!("cached"));
    assert_eq!(
        o.report.get(CallId(1)).map(|c| c.status),
        Some(CallStatus::Failed)
    );
}

#[tokio::test(start_paused = true)]
async fn an_absent_first_alternative_blocks_while_the_stream_is_open() {
    let mut step =
        Step::new(vec![tool("use")]).at(0, json!({"_tool": "use", "v": "†state.a || †state.b"}));
    step.state
        .write(path("state.b"), json!("b"), OutputMethod::Set, None, 0);
    step.close_at = Some(40);
    let o = run(step, TestExec::new(Instant::now())).await;
    assert_eq!(
        o.run_of(1).start,
        40,
        "a later call could still write state.a"
    );
    assert_eq!(o.run_of(1).params["v"], json!("b"));
}

#[tokio::test(start_paused = true)]
async fn a_cycle_over_the_stream_is_refused_and_the_rest_runs() {
    let step = Step::new(vec![tool("t")])
        .at(
            0,
            json!({"_tool": "t", "in": "†state.b", "_outputPath": "†state.a"}),
        )
        .at(
            5,
            json!({"_tool": "t", "in": "†state.a", "_outputPath": "†state.b"}),
        )
        .at(5, json!({"_tool": "t", "_outputPath": "†state.c"}));
    let o = run(step, TestExec::new(Instant::now())).await;
    let refused = o.report.get(CallId(2)).expect("c2");
    assert_eq!(refused.status, CallStatus::Refused);
    let err = refused.error.clone().expect("error");
    assert_eq!(err["code"], json!("graph.cycle"));
    assert_eq!(err["details"]["cycle"], json!([2, 1]));
    assert!(o.events.iter().any(|e| matches!(&e.kind,
        EventKind::CallRefused { cycle, .. } if cycle == &vec![CallId(2), CallId(1)])));
    assert_eq!(
        o.report.get(CallId(3)).map(|c| c.status),
        Some(CallStatus::Done)
    );
    assert_eq!(
        o.report.get(CallId(1)).map(|c| c.status),
        Some(CallStatus::Unresolved)
    );
    // The run's call summary has no `missing`: the error object's details hold it.
    assert_eq!(
        o.report
            .get(CallId(1))
            .and_then(|c| c.error.as_ref())
            .map(|e| e["details"]["missing"].clone()),
        Some(json!(["state.b"]))
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_arriving_after_its_producer_finished_starts_at_once() {
    let step = Step::new(vec![tool("p"), tool("r")])
        .at(0, json!({"_tool": "p", "_outputPath": "†state.x"}))
        .at(50, json!({"_tool": "r", "v": "†state.x"}));
    let o = run(step, TestExec::new(Instant::now())).await;
    assert_eq!(o.run_of(1).end, Some(10));
    assert_eq!(o.run_of(2).start, 50);
    assert_eq!(o.kinds(2), vec!["call_received", "started", "finished"]);
}

#[tokio::test(start_paused = true)]
async fn rule9_a_ready_call_starts_while_the_stream_is_still_open() {
    let mut step = Step::new(vec![tool("p"), tool("r"), tool("late")])
        .at(0, json!({"_tool": "p", "_outputPath": "†state.x"}))
        .at(20, json!({"_tool": "r", "v": "†state.x"}))
        .at(100, json!({"_tool": "late"}));
    step.close_at = Some(200);
    let o = run(step, TestExec::new(Instant::now())).await;
    assert_eq!(
        o.run_of(2).start,
        20,
        "started long before the stream ended at 200"
    );
    assert_eq!(o.run_of(3).start, 100);
    assert_eq!(o.elapsed, 200);
}

#[tokio::test(start_paused = true)]
async fn unresolved_at_stream_close_with_the_missing_paths() {
    let step = Step::new(vec![tool("r"), tool("after")])
        .at(0, json!({"_tool": "r", "v": "†state.nothing", "w": "†input.none", "_outputPath": "†state.r"}))
        .at(0, json!({"_tool": "after", "v": "†state.r"}));
    let o = run(step, TestExec::new(Instant::now())).await;
    assert!(o.runs.is_empty());
    let r = o.report.get(CallId(1)).expect("c1");
    assert_eq!(r.status, CallStatus::Unresolved);
    // The run's call summary has no `missing`: the error object's details hold it.
    let missing =
        |e: &Option<serde_json::Value>| e.as_ref().map(|e| e["details"]["missing"].clone());
    assert_eq!(
        missing(&r.error),
        Some(json!(["input.none", "state.nothing"]))
    );
    assert_eq!(
        r.error.as_ref().map(|e| e["code"].clone()),
        Some(json!("scheduler.unresolved"))
    );
    let after = o.report.get(CallId(2)).expect("c2");
    assert_eq!(
        (after.status, missing(&after.error)),
        (CallStatus::Unresolved, Some(json!(["state.r"])))
    );
}

#[tokio::test(start_paused = true)]
async fn failures_isolate_and_readers_of_a_failed_output_become_unresolved() {
    let exec = TestExec::new(Instant::now())
        .with("boom", Behaviour::Panic(5))
        .with("bad", Behaviour::Fail(5, json!({"error": "nope"})))
        .with("ok", Behaviour::Sleep(20, Some(json!("fine"))));
    let step = Step::new(vec![tool("boom"), tool("bad"), tool("ok"), tool("r")])
        .at(0, json!({"_tool": "boom", "_outputPath": "†state.p"}))
        .at(
            0,
            json!({"_tool": "bad", "_outputPath": "†state.ok || †state.err"}),
        )
        .at(0, json!({"_tool": "ok", "_outputPath": "†state.fine"}))
        .at(0, json!({"_tool": "r", "v": "†state.p"}))
        .at(0, json!({"_tool": "r", "v": "†state.err"}));
    let o = run(step, exec).await;
    let boom = o.report.get(CallId(1)).expect("c1");
    assert_eq!(boom.status, CallStatus::Failed);
    assert_eq!(
        boom.error.as_ref().map(|e| e["code"].clone()),
        Some(json!("scheduler.panic"))
    );
    assert!(o.events.iter().any(|e| e.call == Some(CallId(1))
        && matches!(
            e.kind,
            EventKind::Failed {
                kind: FailKind::Panic,
                ..
            }
        )));
    assert_eq!(
        o.get("state.err"),
        Some(json!({"error": "nope"})),
        "rule 10: failure branch"
    );
    assert_eq!(o.get("state.fine"), Some(json!("fine")));
    assert_eq!(
        o.report.get(CallId(4)).map(|c| c.status),
        Some(CallStatus::Unresolved)
    );
    assert_eq!(o.run_of(5).params["v"], json!({"error": "nope"}));
}

#[tokio::test(start_paused = true)]
async fn per_call_timeout_fails_the_call_and_writes_the_failure_branch() {
    let exec = TestExec::new(Instant::now()).with("hang", Behaviour::Sleep(60_000, None));
    let mut step = Step::new(vec![tool("hang")]).at(
        0,
        json!({"_tool": "hang", "_outputPath": "†state.ok || †state.timeout"}),
    );
    step.call_timeout = Some(std::time::Duration::from_secs(1));
    let o = run(step, exec).await;
    assert_eq!(o.elapsed, 1000);
    assert!(o.events.iter().any(|e| matches!(
        e.kind,
        EventKind::Failed {
            kind: FailKind::Timeout,
            ..
        }
    )));
    assert_eq!(
        o.get("state.timeout").map(|e| e["code"].clone()),
        Some(json!("scheduler.timeout"))
    );
}

#[tokio::test(start_paused = true)]
async fn cancellation_aborts_running_calls_and_reports_everything_cancelled() {
    let exec = TestExec::new(Instant::now()).with("long", Behaviour::Sleep(100, None));
    let mut step = Step::new(vec![tool("long"), tool("r")])
        .at(0, json!({"_tool": "long", "_outputPath": "†state.a"}))
        .at(0, json!({"_tool": "long", "_outputPath": "†state.b"}))
        .at(0, json!({"_tool": "r", "v": "†state.a"}));
    step.close_at = Some(1000);
    step.cancel_at = Some(50);
    let o = run(step, exec).await;
    assert_eq!(o.elapsed, 50, "the run ends as soon as it is cancelled");
    assert_eq!(o.report.count(CallStatus::Cancelled), 3);
    assert!(
        o.runs.iter().all(|r| r.end.is_none()),
        "running activities were aborted"
    );
    assert_eq!(o.state, json!({}), "nothing was written");
    // The step drains; then the run ends (the run's own `run_finished` comes last).
    let kinds: Vec<&str> = o
        .events
        .iter()
        .rev()
        .take(2)
        .map(|e| e.kind.name())
        .collect();
    assert_eq!(kinds, ["run_finished", "step_drained"]);
    for id in 1..=3 {
        assert!(
            o.kinds(id).contains(&"cancelled"),
            "c{id}: {:?}",
            o.kinds(id)
        );
    }
}

#[tokio::test(start_paused = true)]
async fn latent_calls_are_stored_without_running_and_feed_readers() {
    let step = Step::new(vec![latent("summarize"), tool("send")])
        .at(
            0,
            json!({"_tool": "summarize", "text": "x", "_output": {"summary": "short"},
                      "_outputPath": "†state.s && †state.audit.s"}),
        )
        .at(0, json!({"_tool": "send", "body": "†state.s.summary"}))
        .at(0, json!({"_tool": "summarize", "text": "no output"}));
    let o = run(step, TestExec::new(Instant::now())).await;
    assert_eq!(o.runs.len(), 1, "only the activity ran: {:?}", o.runs);
    assert_eq!(o.run_of(2).params["body"], json!("short"));
    assert_eq!(
        o.get("state.audit.s"),
        Some(json!({"summary": "short"})),
        "fan-out write"
    );
    assert_eq!(
        o.kinds(1),
        vec!["call_received", "finished", "written", "written"]
    );
    let bad = o.report.get(CallId(3)).expect("c3");
    assert_eq!(bad.status, CallStatus::Refused);
    assert_eq!(
        bad.error.as_ref().map(|e| e["code"].clone()),
        Some(json!("scheduler.missing_latent_output"))
    );
}

#[tokio::test(start_paused = true)]
async fn invalid_calls_are_refused_with_an_error_and_nothing_else_stops() {
    let mut step = Step::new(vec![tool("t")])
        .at(0, json!({"_tool": "nope"}))
        .at(0, json!({"_tool": "t", "v": "†state.[broken"}))
        .at(0, json!({"_tool": "t", "_outputPath": "†state.items[*]"}))
        .at(0, json!({"_tool": "t", "v": 1}));
    step.calls.push((0, Err("expected `,` at byte 17".into())));
    let o = run(step, TestExec::new(Instant::now())).await;
    let codes: Vec<_> = o
        .report
        .calls
        .iter()
        .map(|c| (c.status, c.error.as_ref().map(|e| e["code"].clone())))
        .collect();
    assert_eq!(
        codes,
        vec![
            (CallStatus::Refused, Some(json!("scheduler.unknown_tool"))),
            (CallStatus::Refused, Some(json!("reference.invalid"))),
            (CallStatus::Refused, Some(json!("reference.invalid"))),
            (CallStatus::Done, None),
            (
                CallStatus::Refused,
                Some(json!("scheduler.unreadable_call"))
            ),
        ]
    );
    let unknown = o.report.calls[0].error.clone().expect("error");
    assert!(
        unknown["message"]
            .as_str()
            .is_some_and(|s| s.contains("available: t")),
        "{unknown}"
    );
    // The element that is no call never had a call: no `call_received`, no tool.
    assert_eq!(o.received(5), None);
    assert_eq!(o.report.calls[4].tool, "");
}

#[tokio::test(start_paused = true)]
async fn calls_without_output_path_report_results_and_write_nothing() {
    let exec = TestExec::new(Instant::now()).with("ping", Behaviour::Sleep(5, Some(json!("pong"))));
    let step = Step::new(vec![tool("ping")]).at(0, json!({"_tool": "ping"}));
    let o = run(step, exec).await;
    assert_eq!(o.state, json!({}), "nothing was written");
    // The run's call summary has no result: its `finished` event carries it.
    assert_eq!(o.result_of(1), Some(json!("pong")));
}

#[tokio::test(start_paused = true)]
async fn an_activity_may_choose_its_branch() {
    let exec = TestExec::new(Instant::now()).with("route", Behaviour::Branch(5, 1));
    let step = Step::new(vec![tool("route")]).at(
        0,
        json!({"_tool": "route", "_outputPath": "†state.sunny || †state.rainy"}),
    );
    let o = run(step, exec).await;
    assert_eq!(o.get("state.rainy"), Some(json!("branched")));
    assert_eq!(o.get("state.sunny"), None);
}

#[tokio::test(start_paused = true)]
async fn detached_calls_are_not_awaited() {
    let mut fire = tool("notify");
    fire.schema.insert("_detached".into(), json!(true));
    let exec = TestExec::new(Instant::now()).with("notify", Behaviour::Sleep(500, None));
    let step = Step::new(vec![fire]).at(0, json!({"_tool": "notify"}));
    let o = run(step, exec).await;
    assert_eq!(o.elapsed, 0);
    assert_eq!(
        o.report.get(CallId(1)).map(|c| c.status),
        Some(CallStatus::Detached)
    );
}

#[tokio::test(start_paused = true)]
async fn the_validator_refuses_bad_params_after_resolution() {
    // The run's validator is the tool's params schema (how a goal says what params it takes).
    let mut t = tool("t");
    t.schema
        .insert("properties".into(), json!({"n": {"type": "number"}}));
    let mut step = Step::new(vec![t])
        .at(0, json!({"_tool": "t", "n": "†input.n"}))
        .at(0, json!({"_tool": "t", "n": 2}));
    step.state.write(
        path("input.n"),
        json!("not a number"),
        OutputMethod::Set,
        None,
        0,
    );
    let o = run(step, TestExec::new(Instant::now())).await;
    let bad = o.report.get(CallId(1)).expect("c1");
    assert_eq!(bad.status, CallStatus::Refused);
    assert_eq!(
        bad.error.as_ref().map(|e| e["code"].clone()),
        Some(json!("scheduler.invalid_params"))
    );
    assert_eq!(
        o.report.get(CallId(2)).map(|c| c.status),
        Some(CallStatus::Done)
    );
}

/// The calls a `started` event names (`read_from`): those whose writes the params were
/// resolved from, which is what a trace links a call's span to. A write that a newer `set`
/// replaced is not read, so its call is not named; a literal param names nothing.
#[tokio::test(start_paused = true)]
async fn a_started_event_names_the_calls_whose_writes_it_read() {
    let exec = TestExec::new(Instant::now())
        .with("slow", Behaviour::Sleep(30, Some(json!("slow"))))
        .with("fast", Behaviour::Sleep(10, Some(json!("fast"))))
        .with("more", Behaviour::Sleep(5, Some(json!({"m": 1}))));
    let step = Step::new(vec![tool("slow"), tool("fast"), tool("more"), tool("read")])
        .at(0, json!({"_tool": "slow", "_outputPath": "†state.x"}))
        .at(0, json!({"_tool": "fast", "_outputPath": "†state.x"}))
        .at(0, json!({"_tool": "read", "v": "†state.x"}))
        .at(
            0,
            json!({"_tool": "more", "_outputPath": "†state.y", "_outputMethod": "merge"}),
        )
        .at(
            0,
            json!({"_tool": "read", "both": ["†state.x", "†state.y.m"], "lit": 2}),
        )
        .at(0, json!({"_tool": "read", "lit": 2}));
    let o = run(step, exec).await;
    let read_from = |id: u64| {
        o.events
            .iter()
            .find_map(|e| match &e.kind {
                EventKind::Started { read_from, .. } if e.call == Some(CallId(id)) => {
                    Some(read_from.clone())
                }
                _ => None,
            })
            .unwrap_or_else(|| panic!("c{id} started"))
    };
    assert_eq!(
        read_from(3),
        vec![CallId(1)],
        "slow's set replaced fast's write: only slow's was read"
    );
    assert_eq!(
        read_from(5),
        vec![CallId(1), CallId(4)],
        "in id order, once each"
    );
    assert!(
        read_from(6).is_empty(),
        "a literal param reads no call's write"
    );
    assert!(read_from(1).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_write_past_the_end_of_an_array_wakes_readers_of_the_padded_indexes() {
    // `state.b[1]` written into a missing array pads `state.b[0]` with null (S6): the reader of
    // `state.b[0]` starts at that write, not when the stream closes at 200.
    let mut step = Step::new(vec![tool("w"), tool("r")])
        .at(
            0,
            json!({"_tool": "r", "v": "†state.b[0]", "x": "†state.c[2].y[0]"}),
        )
        .at(0, json!({"_tool": "w", "_outputPath": "†state.b[1]"}))
        .at(20, json!({"_tool": "w", "_outputPath": "†state.c[2].y[3]"}));
    step.close_at = Some(200);
    let o = run(step, TestExec::new(Instant::now())).await;
    assert_eq!(o.run_of(2).end, Some(10));
    assert_eq!(o.run_of(3).end, Some(30));
    assert_eq!(o.run_of(1).start, 30, "woken by the second padding write");
    assert_eq!(o.run_of(1).params["v"], json!(null));
    assert_eq!(o.run_of(1).params["x"], json!(null));
}
