//! Bounded workflow histories on `dagloop serve --engine temporal` (feature `temporal`; without
//! `DAGLOOP_TEMPORAL` the test prints SKIPPED): a run long enough to pass a lowered history
//! limit continues as new, several times; decisions sent through either server apply across
//! each boundary; an SSE client that follows the run and moves to the other server with
//! `Last-Event-ID` gets every event once; a reader from the start is told which events the
//! workflow no longer keeps (`events_dropped`), then gets the kept ones.
#![cfg(feature = "temporal")]

#[path = "common/bin.rs"]
mod bin;
#[path = "common/cluster.rs"]
mod cluster;
#[path = "common/serve.rs"]
mod serve;
#[path = "common/temporal.rs"]
mod temporal;

use futures::StreamExt;
use serde_json::{Value, json};
use serve::{client, count, counting_service, read_events, send};

/// The calls the run makes, one per turn, each approved by a reviewer.
const CALLS: u64 = 8;

/// A goal whose model makes [`CALLS`] calls, one per turn, each asking a reviewer.
fn long_goal(dir: &std::path::Path, url: &str) -> Value {
    let step = json!({"_tool": "step", "_activity": "http", "_http": {"method": "POST", "url": url},
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
        "additionalProperties": false});
    let mut turns: Vec<Value> = (1..=CALLS)
        .map(|n| {
            json!({"solution": {"calls": [{"_tool": "step", "n": n, "_outputPath": format!("†state.s{n}")}],
                "output": null}, "chunk_chars": 64})
        })
        .collect();
    turns.push(json!({"solution": {"calls": [], "output": {"done": true}}}));
    let script = dir.join("long.json");
    std::fs::write(&script, json!({"turns": turns}).to_string()).expect("script");
    json!({"goal": "many steps", "model": format!("scripted:{}", script.display()),
        "output_schema": {"type": "object", "required": ["done"]},
        "tools": [step], "approval": {"policy": "ask"}})
}

/// The events of `url` after `last`, raw: (id, event type) with frames without an id too.
async fn raw_events(url: &str) -> Vec<(String, String)> {
    use eventsource_stream::Eventsource;
    let r = client().get(url).send().await.expect("events");
    assert_eq!(r.status().as_u16(), 200);
    let mut stream = r.bytes_stream().eventsource();
    let mut out = Vec::new();
    while let Ok(Some(Ok(ev))) =
        tokio::time::timeout(std::time::Duration::from_secs(10), stream.next()).await
    {
        let done = ev.event == "run_finished";
        out.push((ev.id, ev.event));
        if done {
            break;
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_run_continues_as_new_and_keeps_its_events() {
    let env = [
        ("DAGLOOP_TEMPORAL_HISTORY_EVENTS", "40"),
        ("DAGLOOP_TEMPORAL_EVENTS_KEPT", "24"),
    ];
    let Some(c) = cluster::cluster_with(None, &env).await else {
        return;
    };
    let (url, counts) = counting_service().await;
    let body = long_goal(c.dir.path(), &url);
    let id = serve::create(&c.a, &body).await;
    let events = |s: &serve::Server| s.url(&format!("/runs/{id}/events"));

    // A follower on A reads as the run goes; each call is approved through the server that
    // did not serve the previous decision.
    let mut seen = read_events(&events(&c.a), None, 2, None).await;
    for n in 1..=CALLS {
        let on = if n % 2 == 0 { &c.a } else { &c.b };
        let v = cluster::until(on, &id, |v| {
            serve::awaiting(v).iter().any(|x| x["call_id"] == n)
        })
        .await;
        assert_eq!(serve::awaiting(&v).len(), 1, "{v}");
        let (st, v) = cluster::decide(on, &id, n, json!({"decision": "approve"})).await;
        assert_eq!(st, 200, "call {n}: {v}");
        // Following on A for the first half, on B (with Last-Event-ID) for the rest.
        let follow = if n <= CALLS / 2 { &c.a } else { &c.b };
        let more = read_events(&events(follow), seen.last().map(|e| e.0), 0, None).await;
        seen.extend(more);
    }
    let rest = read_events(&events(&c.b), seen.last().map(|e| e.0), 1000, None).await;
    seen.extend(rest);
    assert_eq!(seen.last().map(|e| e.1.as_str()), Some("run_finished"));
    let seqs: Vec<u64> = seen.iter().map(|e| e.0).collect();
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(
        seqs, expected,
        "every event once, in order, across the boundaries"
    );

    let (st, v) = send(client().get(c.b.url(&format!("/runs/{id}/result?wait=60")))).await;
    assert_eq!((st, v["status"].as_str()), (200, Some("succeeded")), "{v}");
    for n in 1..=CALLS {
        assert_eq!(count(&counts, n), 1, "call {n} ran once");
    }
    // It did continue as new: the latest execution's history starts from a carried journal.
    let conn = c.dev.connect().await;
    let history = conn.history_json(&id).await.expect("history");
    let history: Value = serde_json::from_slice(&history).expect("history JSON");
    let started = &history["events"][0]["attributes"]["WorkflowExecutionStartedEventAttributes"];
    let previous = started["continued_execution_run_id"].as_str().unwrap_or("");
    assert!(!previous.is_empty(), "the run continued as new: {started}");
    // Its description is whole: every call with its decision.
    let (_, v) = send(client().get(c.a.url(&format!("/runs/{id}")))).await;
    let calls = v["calls"].as_array().map_or(0, Vec::len);
    assert_eq!(calls as u64, CALLS, "{v}");

    // A reader from the start is told which events are no longer kept, then gets the rest.
    let late = raw_events(&events(&c.b)).await;
    let (first_id, first_kind) = late.first().cloned().expect("an event");
    assert_eq!(
        (first_id.as_str(), first_kind.as_str()),
        ("", "events_dropped")
    );
    let kept: Vec<u64> = late[1..].iter().filter_map(|e| e.0.parse().ok()).collect();
    assert!(!kept.is_empty() && kept.len() < seqs.len(), "{late:?}");
    assert_eq!(
        kept,
        seqs[seqs.len() - kept.len()..],
        "the kept events are the latest"
    );
    let _ = &c.workers;
}

/// A run whose journal passes Temporal's 2 MB payload limit continues as new all the same: past
/// 1 MB the journal is not carried in the continue-as-new input but pulled by the next
/// execution, chunk by chunk, from the previous one (`temporal::carry`). Each of its 12 calls
/// sends 150 KB, which the service echoes: some 3.6 MB of journal, each call approved by a
/// reviewer (the moments the run continues as new).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_past_the_payload_limit_is_carried_in_chunks() {
    const BIG: u64 = 12;
    let env = [("DAGLOOP_TEMPORAL_HISTORY_EVENTS", "40")];
    let Some(c) = cluster::cluster_with(None, &env).await else {
        return;
    };
    let (url, counts) = counting_service().await;
    let step = json!({"_tool": "step", "_activity": "http", "_http": {"method": "POST", "url": url},
        "type": "object", "properties": {"n": {"type": "integer"}, "note": {"type": "string"}},
        "required": ["n"], "additionalProperties": false});
    let mut turns: Vec<Value> = (1..=BIG)
        .map(|n| {
            // Words, not one run of a letter: nothing along the way may compress it away.
            let note: String = (0..150_000 / 8)
                .map(|i| format!("w{:06} ", (i * n) % 999_983))
                .collect();
            json!({"solution": {"calls": [{"_tool": "step", "n": n, "note": note,
                "_outputPath": format!("†state.s{n}")}], "output": null}, "chunk_chars": 65_536})
        })
        .collect();
    turns.push(json!({"solution": {"calls": [], "output": {"done": true}}}));
    let script = c.dir.path().join("big.json");
    std::fs::write(&script, json!({"turns": turns}).to_string()).expect("script");
    let body = json!({"goal": "a long journal", "model": format!("scripted:{}", script.display()),
        "output_schema": {"type": "object", "required": ["done"]},
        "tools": [step], "approval": {"policy": "ask"}});
    let id = serve::create(&c.a, &body).await;
    // A run continues as new while it waits for a reviewer (nothing runs then): each call is
    // approved, through either server, as soon as it waits (its description, which holds the
    // whole state, is not read).
    for n in 1..=BIG {
        let on = if n % 2 == 0 { &c.a } else { &c.b };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
        loop {
            let (st, v) = cluster::decide(on, &id, n, json!({"decision": "approve"})).await;
            if st == 200 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "call {n}: {st} {v}");
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
    let conn = c.dev.connect().await;
    let result = tokio::time::timeout(std::time::Duration::from_secs(240), conn.result(&id))
        .await
        .expect("the run ends within 4 minutes")
        .expect("result");
    assert!(result.succeeded(), "{:?}", result.error);
    for n in 1..=BIG {
        assert_eq!(count(&counts, n), 1, "call {n} ran once");
    }
    // The latest execution continued one whose journal it pulled in chunks: its history holds
    // `carried_chunk` activities, and its input is far below the journal's size.
    let history = conn.history_json(&id).await.expect("history");
    let text = String::from_utf8_lossy(&history);
    assert!(text.contains("carried_chunk"), "no chunk was pulled");
    let history: Value = serde_json::from_slice(&history).expect("history JSON");
    let started = &history["events"][0]["attributes"]["WorkflowExecutionStartedEventAttributes"];
    assert!(
        !started["continued_execution_run_id"]
            .as_str()
            .unwrap_or("")
            .is_empty(),
        "the run continued as new: {started}"
    );
    let input = started["input"].to_string().len();
    assert!(input < 1024 * 1024, "the input carried {input} bytes");
    let _ = &c.workers;
}
