//! A run addressed through its handle (DESIGN.md 3.1): ops in with typed refusals (rule 21),
//! events out without gap or duplicate, journal sinks, delegates inside the parent run, and no
//! task outliving a dropped run. Paused tokio clock throughout.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dagloop::approval::{Decision, ScriptedApprover};
use dagloop::engine::{JournalError, JournalFuture, JournalSink};
use dagloop::llm::{EventStream, Model, Request, Script, ScriptedModel, StreamEvent};
use dagloop::machine::JournalEntry;
use dagloop::{AgentBuilder, CallId, Event, EventKind, Goal, Op, RunHandle, RunStatus};
use futures::StreamExt;
use serde_json::{Value, json};

fn goal_in(dir: &std::path::Path, doc: Value) -> Goal {
    Goal::from_json(&doc.to_string(), "test.json".as_ref(), dir.to_path_buf()).expect("goal")
}

fn model(turns: Value) -> Arc<ScriptedModel> {
    let script = Script::parse(&json!({ "turns": turns }).to_string(), "test").expect("script");
    Arc::new(ScriptedModel::new(script))
}

fn sol(calls: Value, output: Value) -> Value {
    json!({"solution": {"calls": calls, "output": output}, "chunk_chars": 9, "chunk_delay_ms": 1})
}

async fn all_events(h: &RunHandle) -> Vec<Arc<Event>> {
    let mut sub = h.subscribe_from(0);
    let mut v = Vec::new();
    while let Some(e) = sub.recv().await {
        if !e.kind.is_ephemeral() {
            v.push(e);
        }
    }
    v
}

fn counting(
    n: &Arc<AtomicUsize>,
) -> impl Fn(Value) -> futures::future::BoxFuture<'static, Result<Value, String>> + Send + Sync + 'static
{
    let n = n.clone();
    move |_p: Value| {
        n.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move { Ok::<_, String>(json!({"ran": true})) })
    }
}

/// A parent whose delegate calls a tool the parent's policy does not allow: the nested call is
/// presented to the parent's reviewer (path through the delegate call), rejected, and never runs.
#[tokio::test(start_paused = true)]
async fn delegates_run_inside_the_parent_run_under_its_policy() {
    let dir = tempfile::tempdir().expect("dir");
    let helper = json!({"goal": "helper", "output_schema": {"type": "object"},
        "tools": [{"_tool": "danger", "_activity": "rust", "type": "object"}]});
    std::fs::write(dir.path().join("helper.goal.json"), helper.to_string()).expect("write");
    let parent = goal_in(
        dir.path(),
        json!({"goal": "parent", "output_schema": {"type": "object"},
        "tools": [
            {"_tool": "askHelper", "_delegate": "helper.goal.json", "type": "object"},
            {"_tool": "danger", "_activity": "rust", "type": "object"}],
        "approval": {"policy": "allowlist", "allow": ["askHelper"]}}),
    );
    let turns = json!([
        sol(
            json!([{"_tool": "askHelper", "q": "go", "_outputPath": "†state.h"}]),
            Value::Null
        ),
        sol(json!([{"_tool": "danger", "rm": "-rf"}]), Value::Null),
        sol(json!([]), json!({"helped": true})),
        sol(json!([]), json!({"done": "†state.h"})),
    ]);
    let ran = Arc::new(AtomicUsize::new(0));
    let approver = Arc::new(ScriptedApprover::new().for_tool(
        "danger",
        Decision::Reject {
            reason: "not in a delegate either".into(),
        },
    ));
    let mut b = AgentBuilder::new(dagloop::RunDef::from_goal(parent).expect("defined"))
        .model(model(turns))
        .approver(approver.clone());
    let f = counting(&ran);
    b.registry_mut().register_fn("danger", move |p: Value| f(p));
    let h = b.build().expect("build").start();
    let events = all_events(&h).await;
    let r = h.wait().await;
    assert_eq!(r.status, RunStatus::Succeeded, "{r:?}");
    assert_eq!(r.output, json!({"done": {"helped": true}}));
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "the nested call was rejected, never run"
    );
    let reqs = approver.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(
        reqs[0].path,
        vec![CallId(1), CallId(2)],
        "path through the delegate call"
    );
    assert_eq!(reqs[0].run_id, h.run_id());
    let nested: Vec<&Arc<Event>> = events
        .iter()
        .filter(|e| e.parent == Some(CallId(1)))
        .collect();
    assert!(nested.iter().all(|e| e.depth == 1));
    assert!(
        nested
            .iter()
            .any(|e| matches!(e.kind, EventKind::RunStarted { .. }))
    );
    let received: Vec<CallId> = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::CallReceived { .. }))
        .filter_map(|e| e.call)
        .collect();
    assert_eq!(
        received,
        vec![CallId(1), CallId(2)],
        "one id space for the whole run"
    );
}

#[tokio::test(start_paused = true)]
async fn ops_are_checked_against_the_run_and_refusals_change_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let g = goal_in(
        dir.path(),
        json!({"goal": "g", "output_schema": {"type": "object"},
        "tools": [
            {"_tool": "pay", "_activity": "rust", "type": "object",
             "properties": {"amount": {"type": "number", "maximum": 100}}, "required": ["amount"]},
            {"_tool": "wire", "_activity": "rust", "_approval": "always", "type": "object"}],
        "approval": {"policy": "ask"}}),
    );
    let turns = json!([
        sol(json!([{"_tool": "pay", "amount": 30}]), Value::Null),
        sol(json!([]), json!({"ok": true})),
    ]);
    let paid = Arc::new(Mutex::new(Vec::new()));
    let mut b = AgentBuilder::new(dagloop::RunDef::from_goal(g).expect("defined"))
        .model(model(turns))
        .external_review();
    let p2 = paid.clone();
    b.registry_mut().register_fn("pay", move |p: Value| {
        let p2 = p2.clone();
        async move {
            p2.lock().expect("paid").push(p["amount"].clone());
            Ok::<_, String>(json!({"paid": p["amount"]}))
        }
    });
    b.registry_mut()
        .register_fn("wire", |_p: Value| async move { Ok::<_, String>(json!(1)) });
    let h = b.build().expect("build").start();
    let mut sub = h.subscribe_from(0);
    let (call, hash) = loop {
        let e = sub.recv().await.expect("an approval request");
        if let (EventKind::ApprovalRequested { params_hash, .. }, Some(c)) = (&e.kind, e.call) {
            break (c, params_hash.clone());
        }
    };
    let decide = |d: Decision, presented: Option<String>| Op::Decide {
        call,
        decision: d,
        presented,
        presentation: None,
        by: None,
    };
    let code = |r: Result<(), dagloop::OpError>| r.err().map(|e| e.code());
    let unknown = Op::Decide {
        call: CallId(99),
        decision: Decision::Approve,
        presented: None,
        presentation: None,
        by: None,
    };
    assert_eq!(code(h.submit(unknown).await), Some("op.unknown_call"));
    assert_eq!(
        code(
            h.submit(decide(Decision::Approve, Some("feedbeef".into())))
                .await
        ),
        Some("op.stale")
    );
    let to_wire = Decision::Edit {
        params: json!({"_tool": "wire"})
            .as_object()
            .cloned()
            .unwrap_or_default(),
    };
    assert_eq!(
        code(h.submit(decide(to_wire, None)).await),
        Some("op.edit_changes_tool")
    );
    let too_much = Decision::Edit {
        params: json!({"amount": 500})
            .as_object()
            .cloned()
            .unwrap_or_default(),
    };
    assert_eq!(
        code(h.submit(decide(too_much, None)).await),
        Some("op.invalid_decision")
    );
    let ok = Decision::Edit {
        params: json!({"amount": 45})
            .as_object()
            .cloned()
            .unwrap_or_default(),
    };
    assert_eq!(code(h.submit(decide(ok, Some(hash.clone()))).await), None);
    assert_eq!(
        code(h.submit(decide(Decision::Approve, Some(hash))).await),
        Some("op.already_decided")
    );
    let r = h.wait().await;
    assert_eq!(r.status, RunStatus::Succeeded);
    assert_eq!(
        *paid.lock().expect("paid"),
        vec![json!(45)],
        "the edited params ran, once"
    );
    assert_eq!(r.calls[0].decision.as_deref(), Some("edit"));
    assert_eq!(
        code(h.submit(decide(Decision::Approve, None)).await),
        Some("op.run_finished")
    );
}

#[tokio::test(start_paused = true)]
async fn a_replacement_goes_through_the_replacing_tools_own_gate() {
    let dir = tempfile::tempdir().expect("dir");
    let g = goal_in(
        dir.path(),
        json!({"goal": "g", "output_schema": {"type": "object"},
        "tools": [
            {"_tool": "draft", "_activity": "rust", "type": "object"},
            {"_tool": "send", "_activity": "rust", "_approval": "always", "type": "object"}],
        "approval": {"policy": "allowlist", "allow": []}}),
    );
    let turns = json!([
        sol(json!([{"_tool": "draft"}]), Value::Null),
        sol(json!([]), json!({}))
    ]);
    let approver = Arc::new(
        ScriptedApprover::new()
            .then(Decision::Replace {
                call: Box::new(dagloop::Call::new("send").param("to", "ceo")),
            })
            .then(Decision::Reject {
                reason: "not that either".into(),
            }),
    );
    let sent = Arc::new(AtomicUsize::new(0));
    let mut b = AgentBuilder::new(dagloop::RunDef::from_goal(g).expect("defined"))
        .model(model(turns))
        .approver(approver.clone());
    b.registry_mut().register_fn(
        "draft",
        |_p: Value| async move { Ok::<_, String>(json!(1)) },
    );
    let f = counting(&sent);
    b.registry_mut().register_fn("send", move |p: Value| f(p));
    let r = b.build().expect("build").run().await;
    let asked: Vec<String> = approver
        .requests()
        .iter()
        .map(|r| r.call.tool.clone())
        .collect();
    assert_eq!(
        asked,
        vec!["draft", "send"],
        "the replacement was presented on its own"
    );
    assert_eq!(sent.load(Ordering::SeqCst), 0);
    assert_eq!(r.calls[0].status, dagloop::scheduler::CallStatus::Rejected);
}

#[tokio::test(start_paused = true)]
async fn late_subscribers_get_every_event_once_in_order() {
    let dir = tempfile::tempdir().expect("dir");
    let g = goal_in(
        dir.path(),
        json!({"goal": "g", "output_schema": {"type": "object"},
        "tools": [{"_tool": "t", "_activity": "rust", "type": "object"}]}),
    );
    let calls: Vec<Value> = (0..6)
        .map(|i| json!({"_tool": "t", "i": i, "_outputPath": format!("†state.r{i}")}))
        .collect();
    let turns = json!([
        sol(json!(calls), Value::Null),
        sol(json!([]), json!({"ok": 1}))
    ]);
    let mut b =
        AgentBuilder::new(dagloop::RunDef::from_goal(g).expect("defined")).model(model(turns));
    b.registry_mut().register_fn("t", |p: Value| async move {
        tokio::time::sleep(Duration::from_millis(5 * p["i"].as_u64().unwrap_or(0))).await;
        Ok::<_, String>(p)
    });
    let h = b.build().expect("build").start();
    let mut early = h.subscribe_from(0);
    let mut first = Vec::new();
    while first.len() < 7 {
        let e = early.recv().await.expect("event");
        if !e.kind.is_ephemeral() {
            first.push(e);
        }
    }
    // Mid-run: a new subscriber asks for everything after the 4th event.
    let mut late = h.subscribe_from(4);
    let mut rest = Vec::new();
    while let Some(e) = late.recv().await {
        if !e.kind.is_ephemeral() {
            rest.push(e);
        }
    }
    let full = all_events(&h).await;
    assert_eq!(h.wait().await.status, RunStatus::Succeeded);
    let seqs: Vec<u64> = full.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=full.len() as u64).collect::<Vec<_>>());
    assert_eq!(
        rest.iter().map(|e| e.seq).collect::<Vec<_>>(),
        seqs[4..].to_vec()
    );
    assert_eq!(&full[..7], &first[..]);
    assert_eq!(
        full,
        rest.iter().fold(full[..4].to_vec(), |mut v, e| {
            v.push(e.clone());
            v
        })
    );
}

struct FailingSink {
    after: usize,
    panic: bool,
    seen: AtomicUsize,
}

impl JournalSink for FailingSink {
    fn append<'a>(&'a self, _run: &'a str, _entries: &'a [JournalEntry]) -> JournalFuture<'a> {
        let n = self.seen.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            if n >= self.after {
                if self.panic {
                    panic!("disk on fire");
                }
                return Err(JournalError::new(JournalError::WRITE, "disk full"));
            }
            Ok(())
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_failing_or_panicking_journal_sink_stops_the_run_with_a_code() {
    for panic in [false, true] {
        let dir = tempfile::tempdir().expect("dir");
        let g = goal_in(
            dir.path(),
            json!({"goal": "g", "output_schema": {"type": "object"}}),
        );
        let turns = json!([sol(json!([]), Value::Null), sol(json!([]), json!({}))]);
        let sink = Arc::new(FailingSink {
            after: 2,
            panic,
            seen: AtomicUsize::new(0),
        });
        let r = AgentBuilder::new(dagloop::RunDef::from_goal(g).expect("defined"))
            .model(model(turns))
            .journal(sink)
            .build()
            .expect("b")
            .run()
            .await;
        // Stopped, not ended: the machine decided nothing, and the run can be resumed.
        assert_eq!(r.status, RunStatus::Stopped, "panic={panic}");
        assert!(!r.status.is_final());
        assert_eq!(
            r.error.as_ref().map(|e| e.code.as_str()),
            Some("store.journal_write")
        );
    }
}

struct Flag(Arc<AtomicBool>);
impl Drop for Flag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Streams one call, then nothing, forever; notes when its stream is dropped.
struct Hanging(Arc<AtomicBool>);
impl Model for Hanging {
    fn stream(&self, _req: &Request) -> EventStream {
        let flag = Flag(self.0.clone());
        let first = futures::stream::iter(vec![Ok(StreamEvent::TextDelta(
            r#"{"calls": [{"_tool": "slow"}, "#.into(),
        ))]);
        first
            .chain(futures::stream::pending())
            .map(move |e| {
                let _keep = &flag;
                e
            })
            .boxed()
    }
    fn name(&self) -> String {
        "hanging".into()
    }
}

#[tokio::test(start_paused = true)]
async fn dropping_or_cancelling_a_run_stops_every_task_it_owns() {
    for cancel in [false, true] {
        let dir = tempfile::tempdir().expect("dir");
        let g = goal_in(
            dir.path(),
            json!({"goal": "g", "output_schema": {},
            "tools": [{"_tool": "slow", "_activity": "rust", "type": "object"}]}),
        );
        let stream_closed = Arc::new(AtomicBool::new(false));
        let activity_dropped = Arc::new(AtomicBool::new(false));
        let started = Arc::new(tokio::sync::Notify::new());
        let mut b = AgentBuilder::new(dagloop::RunDef::from_goal(g).expect("defined"))
            .model(Arc::new(Hanging(stream_closed.clone())));
        let (ad, st) = (activity_dropped.clone(), started.clone());
        b.registry_mut().register_fn("slow", move |_p: Value| {
            let guard = Flag(ad.clone());
            st.notify_one();
            async move {
                let _guard = guard;
                std::future::pending::<()>().await;
                Ok::<_, String>(json!(1))
            }
        });
        let baseline = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        let h = b.build().expect("build").start();
        started.notified().await;
        if cancel {
            h.cancel("test").await.expect("cancel applies");
            assert_eq!(h.wait().await.status, RunStatus::Cancelled);
        }
        drop(h);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(
            activity_dropped.load(Ordering::SeqCst),
            "activity stopped (cancel={cancel})"
        );
        assert!(
            stream_closed.load(Ordering::SeqCst),
            "model stream closed (cancel={cancel})"
        );
        let alive = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        assert_eq!(
            alive, baseline,
            "no task outlives the run (cancel={cancel})"
        );
    }
}

/// The driver sends a batch's events together (one send per batch of inputs, not one per
/// event), and a live subscriber still reads every event once, in order, numbered 1, 2, 3...
#[tokio::test(start_paused = true)]
async fn events_go_out_a_batch_at_a_time_and_arrive_one_by_one_in_order() {
    let dir = tempfile::tempdir().expect("dir");
    let h = echo_calls(dir.path(), 20).build().expect("build").start();
    // Before the driver ran at all (one thread): every event arrives live.
    let mut live = h.subscribe_from(0);
    let (mut journaled, mut ephemeral) = (Vec::new(), 0u64);
    while let Some(e) = live.recv().await {
        if e.kind.is_ephemeral() {
            ephemeral += 1;
        } else {
            journaled.push(e);
        }
    }
    assert_eq!(h.wait().await.status, RunStatus::Succeeded);
    let seqs: Vec<u64> = journaled.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "gapless, in order"
    );
    assert!(journaled.len() > 60, "{}", journaled.len());
    assert_eq!(live.lagged(), 0, "read live, not caught up");
    let events = journaled.len() as u64 + ephemeral;
    assert!(
        live.live_batches() > 0 && live.live_batches() < events,
        "{} sends for {events} events",
        live.live_batches()
    );
    assert_eq!(
        journaled,
        all_events(&h).await,
        "as a late subscriber reads them"
    );
}

#[tokio::test(start_paused = true)]
async fn a_subscriber_that_falls_behind_is_caught_up_from_the_journal() {
    // 4 is the ring's size; tokio rounds 3 and 5 up to 4 and 8.
    for capacity in [4, 3, 5] {
        falls_behind_a_ring_of(capacity).await;
    }
}

/// A run whose model makes `n` calls of the echoing tool `t` in one step, then answers.
fn echo_calls(dir: &std::path::Path, n: usize) -> AgentBuilder {
    let g = goal_in(
        dir,
        json!({"goal": "g", "output_schema": {"type": "object"},
        "tools": [{"_tool": "t", "_activity": "rust", "type": "object"}]}),
    );
    let calls: Vec<Value> = (0..n).map(|i| json!({"_tool": "t", "i": i})).collect();
    let turns = json!([
        sol(json!(calls), Value::Null),
        sol(json!([]), json!({"ok": 1}))
    ]);
    let mut b =
        AgentBuilder::new(dagloop::RunDef::from_goal(g).expect("defined")).model(model(turns));
    b.registry_mut()
        .register_fn("t", |p: Value| async move { Ok::<_, String>(p) });
    b
}

async fn falls_behind_a_ring_of(capacity: usize) {
    let dir = tempfile::tempdir().expect("dir");
    let b = echo_calls(dir.path(), 20).event_capacity(capacity);
    let h = b.build().expect("build").start();
    let mut slow = h.subscribe_from(0);
    assert_eq!(h.wait().await.status, RunStatus::Succeeded);
    let mut got = Vec::new();
    while let Some(e) = slow.recv().await {
        if !e.kind.is_ephemeral() {
            got.push(e);
        }
    }
    assert!(slow.lagged() > 0, "the ring of {capacity} was overrun");
    assert_eq!(
        h.event_replays(),
        0,
        "served from the events kept once the ring filled, not from a replay"
    );
    let full = all_events(&h).await;
    assert!(full.len() > 60, "{}", full.len());
    assert_eq!(got, full, "caught up without gap or duplicate");
    for (a, b) in got.iter().zip(&full) {
        assert!(Arc::ptr_eq(a, b), "the kept events themselves: {a:?}");
    }
    assert_eq!(h.event_replays(), 0, "a later subscriber reads them too");
}

/// A subscriber that joins after more events than the ring holds went out to nobody is served
/// from one replay of the journal; a second late subscriber reuses it.
#[tokio::test(start_paused = true)]
async fn a_subscriber_that_joins_late_is_served_from_one_replay() {
    let dir = tempfile::tempdir().expect("dir");
    let b = echo_calls(dir.path(), 5).event_capacity(8);
    let h = b.build().expect("build").start();
    assert_eq!(h.wait().await.status, RunStatus::Succeeded);
    let first = all_events(&h).await;
    let second = all_events(&h).await;
    assert!(first.len() > 20, "{}", first.len());
    assert_eq!(first, second);
    assert_eq!(h.event_replays(), 1, "one replay serves both");
}

/// A subscriber that joins after the run's first events went out to nobody (the race of a
/// program that starts a run, then subscribes) is served from the events the run kept, not
/// from a replay of its journal, and sees the same events a replay gives.
#[tokio::test(start_paused = true)]
async fn a_subscriber_that_joins_just_after_the_start_needs_no_replay() {
    let dir = tempfile::tempdir().expect("dir");
    let h = echo_calls(dir.path(), 5).build().expect("build").start();
    assert_eq!(h.wait().await.status, RunStatus::Succeeded);
    let kept = all_events(&h).await;
    assert_eq!(h.event_replays(), 0, "the run's first events were kept");
    assert!(kept.len() > 20, "{}", kept.len());
    let replayed = echo_calls(dir.path(), 5)
        .event_capacity(8)
        .build()
        .expect("build");
    let replayed = replayed.start();
    assert_eq!(replayed.wait().await.status, RunStatus::Succeeded);
    let replayed_events = all_events(&replayed).await;
    assert_eq!(replayed.event_replays(), 1, "past the ring, a replay");
    let names = |v: &[Arc<Event>]| v.iter().map(|e| (e.seq, e.kind.name())).collect::<Vec<_>>();
    assert_eq!(names(&kept), names(&replayed_events));
    // Still every event once, for a subscriber that joins from the middle.
    let from = kept[kept.len() / 2].seq;
    let mut sub = h.subscribe_from(from);
    let mut rest = Vec::new();
    while let Some(e) = sub.recv().await {
        if !e.kind.is_ephemeral() {
            rest.push(e);
        }
    }
    assert_eq!(names(&rest), names(&kept[kept.len() / 2 + 1..]));
}

/// A call's result is one allocation shared by the journal's outcome and the `finished` event
/// (and, inside the machine, the state's write): keeping events costs no copy of results.
#[tokio::test(start_paused = true)]
async fn a_result_is_shared_by_the_journal_and_its_event() {
    let dir = tempfile::tempdir().expect("dir");
    let doc = json!({"goal": "g", "output_schema": {"type": "object"},
        "tools": [{"_tool": "t", "_activity": "rust", "type": "object"}]});
    let turns = json!([
        sol(
            json!([{"_tool": "t", "_outputPath": "†state.big"}]),
            Value::Null
        ),
        sol(json!([]), json!({"ok": true})),
    ]);
    let mut b =
        AgentBuilder::new(dagloop::RunDef::from_goal(goal_in(dir.path(), doc)).expect("defined"))
            .model(model(turns));
    b.registry_mut().register_fn("t", |_: Value| async move {
        Ok::<_, String>(json!({"blob": "x".repeat(100_000)}))
    });
    let h = b.build().expect("build").start();
    let mut events = h.subscribe_from(0);
    let mut finished = None;
    while let Some(e) = events.recv().await {
        if let EventKind::Finished { result } = &e.kind {
            finished = Some(result.clone());
        }
    }
    let r = h.wait().await;
    assert_eq!(r.status, RunStatus::Succeeded);
    assert_eq!(r.state["big"]["blob"].as_str().map(str::len), Some(100_000));
    let finished = finished.expect("a finished event");
    let journaled = h
        .journal()
        .into_iter()
        .find_map(|e| match e.input {
            dagloop::machine::RunInput::Outcome { outcome, .. } => outcome.result.ok(),
            _ => None,
        })
        .expect("a journaled outcome");
    assert!(Arc::ptr_eq(&finished, &journaled), "one result, not copies");
}

/// Cancelling the run cancels the nested agent too: its running activity is stopped and the
/// delegate call is reported cancelled.
#[tokio::test(start_paused = true)]
async fn a_delegate_is_cancelled_with_its_parent() {
    let dir = tempfile::tempdir().expect("dir");
    let helper = json!({"goal": "helper", "output_schema": {"type": "object"},
        "tools": [{"_tool": "hang", "_activity": "rust", "type": "object"}]});
    std::fs::write(dir.path().join("helper.goal.json"), helper.to_string()).expect("write");
    let parent = goal_in(
        dir.path(),
        json!({"goal": "parent", "output_schema": {"type": "object"},
        "tools": [{"_tool": "askHelper", "_activity": "delegate", "_delegate": "helper.goal.json",
                   "type": "object"},
                  {"_tool": "hang", "_activity": "rust", "type": "object"}]}),
    );
    let turns = json!([
        sol(json!([{"_tool": "askHelper"}]), Value::Null),
        sol(json!([{"_tool": "hang"}]), Value::Null),
    ]);
    let dropped = Arc::new(AtomicBool::new(false));
    let started = Arc::new(tokio::sync::Notify::new());
    let mut b =
        AgentBuilder::new(dagloop::RunDef::from_goal(parent).expect("defined")).model(model(turns));
    let (d, st) = (dropped.clone(), started.clone());
    b.registry_mut().register_fn("hang", move |_p: Value| {
        let guard = Flag(d.clone());
        st.notify_one();
        async move {
            let _guard = guard;
            std::future::pending::<()>().await;
            Ok::<_, String>(json!(1))
        }
    });
    let h = b.build().expect("build").start();
    started.notified().await;
    h.cancel("stop").await.expect("cancel applies");
    let r = h.wait().await;
    assert_eq!(r.status, RunStatus::Cancelled);
    assert_eq!(r.calls[0].status, dagloop::scheduler::CallStatus::Cancelled);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(
        dropped.load(Ordering::SeqCst),
        "the nested agent's activity was stopped"
    );
    let events = all_events(&h).await;
    assert!(
        events.iter().any(|e| e.parent == Some(CallId(1))
            && e.call == Some(CallId(2))
            && matches!(e.kind, EventKind::Cancelled)),
        "the nested call is reported cancelled on the run's stream"
    );
}

/// Streams a Solution and never reports usage (like some local servers); notes the characters
/// of every request's messages as JSON.
#[derive(Default)]
struct Silent(Mutex<Vec<usize>>);
impl Model for Silent {
    fn stream(&self, req: &Request) -> EventStream {
        let sent = serde_json::to_string(&req.messages).map_or(0, |t| t.chars().count());
        if let Ok(mut s) = self.0.lock() {
            s.push(sent);
        }
        let text =
            json!({"calls": [{"_tool": "t", "pad": "x".repeat(400)}], "output": null}).to_string();
        futures::stream::iter(vec![
            Ok(StreamEvent::TextDelta(text)),
            Ok(StreamEvent::Finish {
                reason: dagloop::llm::FinishReason::Stop,
            }),
        ])
        .boxed()
    }
    fn name(&self) -> String {
        "silent".into()
    }
}

#[tokio::test(start_paused = true)]
async fn a_token_budget_holds_when_the_server_reports_no_usage() {
    let dir = tempfile::tempdir().expect("dir");
    let g = goal_in(
        dir.path(),
        json!({"goal": "g", "output_schema": {"type": "object"},
        "tools": [{"_tool": "t", "_activity": "rust", "type": "object"}],
        "limits": {"token_budget": 300}}),
    );
    let silent = Arc::new(Silent::default());
    let mut b =
        AgentBuilder::new(dagloop::RunDef::from_goal(g).expect("defined")).model(silent.clone());
    b.registry_mut()
        .register_fn("t", |_p: Value| async move { Ok::<_, String>(json!(1)) });
    let r = b.build().expect("build").run().await;
    assert_eq!(r.status, RunStatus::TokenBudget, "{r:?}");
    assert!(
        r.usage.estimated,
        "the result says the figures are estimates"
    );
    assert!(r.usage.output_tokens >= 100, "{:?}", r.usage);
    // What was sent is estimated too: a token per 4 characters of each request's messages.
    let sent = silent.0.lock().expect("requests").clone();
    assert!(!sent.is_empty());
    let expected: u64 = sent.iter().map(|n| n.div_ceil(4) as u64).sum();
    assert_eq!(r.usage.input_tokens, expected, "{sent:?}");
}

/// Replays a script, noting the mode and the messages of every request; request number
/// `hang_at` (from 0) never answers.
struct ModeRecorder {
    inner: ScriptedModel,
    modes: Arc<Mutex<Vec<dagloop::llm::Mode>>>,
    messages: Arc<Mutex<Vec<Vec<dagloop::protocol::Message>>>>,
    hang_at: Option<usize>,
}
impl Model for ModeRecorder {
    fn stream(&self, req: &Request) -> EventStream {
        self.messages
            .lock()
            .expect("messages")
            .push(req.messages.clone());
        let n = {
            let mut m = self.modes.lock().expect("modes");
            m.push(req.settings.mode);
            m.len() - 1
        };
        if Some(n) == self.hang_at {
            return futures::stream::pending().boxed();
        }
        self.inner.stream(req)
    }
    fn name(&self) -> String {
        "mode-recorder".into()
    }
    fn resume_after(&self, attempts: usize) {
        self.inner.resume_after(attempts);
    }
}

/// A delegate goal's own `mode` is its nested agent's: the parent answers in structured mode,
/// the helper (whose goal says `"mode": "tools"`) through native tool calls, and a run resumed
/// while the helper's turn streamed asks that turn again in tools mode.
#[tokio::test(start_paused = true)]
async fn a_delegate_answers_in_its_own_mode_also_after_a_resume() {
    use dagloop::llm::Mode;
    let dir = tempfile::tempdir().expect("dir");
    let helper = json!({"goal": "helper", "mode": "tools",
        "output_schema": {"type": "object", "required": ["y"], "properties": {"y": {"type": "integer"}}}});
    std::fs::write(dir.path().join("helper.goal.json"), helper.to_string()).expect("write");
    let parent = json!({"goal": "parent", "output_schema": {"type": "object"},
        "tools": [{"_tool": "askHelper", "_delegate": "helper.goal.json", "type": "object"}]});
    let turns = json!([
        sol(
            json!([{"_tool": "askHelper", "x": 2, "_outputPath": "†state.h"}]),
            Value::Null
        ),
        sol(json!([]), json!({"y": 4})),
        sol(json!([]), json!({"done": "†state.h"})),
    ]);
    let script = || {
        ScriptedModel::new(
            Script::parse(&json!({ "turns": turns }).to_string(), "t").expect("script"),
        )
    };

    // Straight through: the helper's request is in tools mode; its output came back through
    // `final_output` (the scripted model answers in the mode it is asked in).
    let modes = Arc::new(Mutex::new(Vec::new()));
    let model = ModeRecorder {
        inner: script(),
        modes: modes.clone(),
        messages: Default::default(),
        hang_at: None,
    };
    let r = AgentBuilder::new(
        dagloop::RunDef::from_goal(goal_in(dir.path(), parent.clone())).expect("defined"),
    )
    .model(Arc::new(model))
    .build()
    .expect("build")
    .run()
    .await;
    assert_eq!(r.status, RunStatus::Succeeded, "{r:?}");
    assert_eq!(r.output, json!({"done": {"y": 4}}));
    assert_eq!(
        *modes.lock().expect("modes"),
        vec![
            Mode::StructuredOutput,
            Mode::ToolCalls,
            Mode::StructuredOutput
        ]
    );

    // Stopped while the helper's turn streams, then resumed from the journal.
    let modes = Arc::new(Mutex::new(Vec::new()));
    let model = ModeRecorder {
        inner: script(),
        modes: modes.clone(),
        messages: Default::default(),
        hang_at: Some(1),
    };
    let h = AgentBuilder::new(
        dagloop::RunDef::from_goal(goal_in(dir.path(), parent.clone())).expect("defined"),
    )
    .model(Arc::new(model))
    .build()
    .expect("build")
    .start();
    // The parent's own turn has closed its stream; the helper's is open.
    let parent_closed = |j: &[JournalEntry]| {
        j.iter().any(|e| {
            matches!(
                e.input,
                dagloop::machine::RunInput::StreamClosed { frame: None, .. }
            )
        })
    };
    while !parent_closed(&h.journal()) || modes.lock().expect("modes").len() < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let journal = h.journal();
    let run_id = h.run_id().to_string();
    drop(h);
    let modes = Arc::new(Mutex::new(Vec::new()));
    let model = ModeRecorder {
        inner: script(),
        modes: modes.clone(),
        messages: Default::default(),
        hang_at: None,
    };
    let r = AgentBuilder::new(
        dagloop::RunDef::from_goal(goal_in(dir.path(), parent)).expect("defined"),
    )
    .model(Arc::new(model))
    .run_id(run_id)
    .build()
    .expect("build")
    .resume(journal)
    .wait()
    .await;
    assert_eq!(r.status, RunStatus::Succeeded, "{r:?}");
    assert_eq!(
        *modes.lock().expect("modes"),
        vec![Mode::ToolCalls, Mode::StructuredOutput],
        "the helper's turn was asked again in its own mode"
    );
}

/// A call is held once: the journal's input and the `call_received` event a subscriber gets are
/// the same allocation, not copies (large params cost their size once per run).
#[tokio::test(start_paused = true)]
async fn a_call_is_shared_by_the_journal_and_its_event() {
    let dir = tempfile::tempdir().expect("dir");
    let doc = json!({"goal": "g", "output_schema": {"type": "object"},
        "tools": [{"_tool": "t", "_activity": "rust", "type": "object"}]});
    let turns = json!([
        sol(
            json!([{"_tool": "t", "big": "x".repeat(1000)}]),
            Value::Null
        ),
        sol(json!([]), json!({"ok": true})),
    ]);
    let mut b =
        AgentBuilder::new(dagloop::RunDef::from_goal(goal_in(dir.path(), doc)).expect("defined"))
            .model(model(turns));
    b.registry_mut()
        .register_fn("t", |_: Value| async move { Ok::<_, String>(1) });
    let h = b.build().expect("build").start();
    let mut events = h.subscribe_from(0);
    let mut received = None;
    while let Some(e) = events.recv().await {
        if let EventKind::CallReceived { call } = &e.kind {
            received = Some(call.clone());
        }
    }
    assert_eq!(h.wait().await.status, RunStatus::Succeeded);
    let received = received.expect("a call_received event");
    let journaled = h
        .journal()
        .into_iter()
        .find_map(|e| match e.input {
            dagloop::machine::RunInput::Call { call, .. } => Some(call),
            _ => None,
        })
        .expect("a journaled call");
    assert!(Arc::ptr_eq(&received, &journaled), "one call, not copies");
}

/// A turn that was streaming when the run stopped is asked again with exactly the context it was
/// first asked with (the plan and state of the step before): the rebuilt machine keeps each
/// turn's context, which a fresh run's machine does not.
#[tokio::test(start_paused = true)]
async fn a_resumed_run_asks_the_interrupted_turn_with_the_same_context() {
    let dir = tempfile::tempdir().expect("dir");
    let doc = json!({"goal": "g", "output_schema": {"type": "object"},
        "tools": [{"_tool": "t", "_activity": "rust", "type": "object"}]});
    let turns = json!([
        sol(
            json!([{"_tool": "t", "x": 1, "_outputPath": "†state.a"}]),
            Value::Null
        ),
        sol(json!([]), json!({"ok": "†state.a"})),
    ]);
    let recorder = |hang_at| {
        let model = ModeRecorder {
            inner: ScriptedModel::new(
                Script::parse(&json!({ "turns": turns }).to_string(), "test").expect("script"),
            ),
            modes: Default::default(),
            messages: Default::default(),
            hang_at,
        };
        let messages = model.messages.clone();
        (model, messages)
    };
    let build = |model: ModeRecorder| {
        let mut b = AgentBuilder::new(
            dagloop::RunDef::from_goal(goal_in(dir.path(), doc.clone())).expect("defined"),
        )
        .model(Arc::new(model));
        b.registry_mut().register_fn(
            "t",
            |p: Value| async move { Ok::<_, String>(p["x"].clone()) },
        );
        b
    };
    // The second request (step 2: the plan and state of step 1) never answers.
    let (model, first) = recorder(Some(1));
    let h = build(model).build().expect("build").start();
    while first.lock().expect("messages").len() < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (journal, run_id) = (h.journal(), h.run_id().to_string());
    drop(h);
    let asked = first.lock().expect("messages")[1].clone();
    let plan = asked
        .iter()
        .find_map(|m| match m {
            dagloop::protocol::Message::Plan { plan, .. } => Some(plan.clone()),
            _ => None,
        })
        .expect("step 2 shows the plan of step 1");
    assert_eq!(plan[0].to_value()["_status"], json!("done"), "{plan:?}");

    let (model, again) = recorder(None);
    let r = build(model)
        .run_id(run_id)
        .build()
        .expect("build")
        .resume(journal)
        .wait()
        .await;
    assert_eq!(r.status, RunStatus::Succeeded, "{r:?}");
    assert_eq!(r.output, json!({"ok": 1}));
    let again = again.lock().expect("messages").clone();
    assert_eq!(again.len(), 1, "only the interrupted turn is asked again");
    assert_eq!(again[0], asked, "asked again with the same context");
}

/// Catch-ups share one replay: a subscriber that joins while the run waits for a reviewer is
/// served from a replay of the journal so far; one that joins after the run went on is served
/// from that replay and the events kept since. Both see exactly what a live subscriber saw.
#[tokio::test(start_paused = true)]
async fn late_subscribers_are_caught_up_from_one_replay_then_the_kept_history() {
    let dir = tempfile::tempdir().expect("dir");
    let g = goal_in(
        dir.path(),
        json!({"goal": "g", "output_schema": {"type": "object"},
        "tools": [{"_tool": "t", "_activity": "rust", "type": "object"}],
        "approval": {"policy": "ask"}}),
    );
    let calls: Vec<Value> = (0..3).map(|i| json!({"_tool": "t", "i": i})).collect();
    let turns = json!([
        sol(json!(calls), Value::Null),
        sol(json!([]), json!({"ok": 1}))
    ]);
    let mut b = AgentBuilder::new(dagloop::RunDef::from_goal(g).expect("defined"))
        .model(model(turns))
        .external_review()
        .event_capacity(2);
    b.registry_mut()
        .register_fn("t", |p: Value| async move { Ok::<_, String>(p) });
    let h = b.build().expect("build").start();
    // Wait (live) until all three calls await a decision.
    let mut live = h.subscribe_from(0);
    let mut asked = Vec::new();
    while asked.len() < 3 {
        let e = live.recv().await.expect("an event");
        if let (EventKind::ApprovalRequested { params_hash, .. }, Some(c)) = (&e.kind, e.call) {
            asked.push((c, params_hash.clone()));
        }
    }
    // Joins now: a replay of the journal so far.
    let mut early = h.subscribe_from(0);
    let mut first = Vec::new();
    while first.len() < 4 {
        let e = early.recv().await.expect("a caught-up event");
        if !e.kind.is_ephemeral() {
            first.push(e);
        }
    }
    for (call, hash) in asked {
        let op = Op::Decide {
            call,
            decision: Decision::Approve,
            presented: Some(hash),
            presentation: None,
            by: None,
        };
        h.submit(op).await.expect("approve");
    }
    assert_eq!(h.wait().await.status, RunStatus::Succeeded);
    // Joins after the run went on: the replay made for `early`, then the events kept since.
    let late = all_events(&h).await;
    let mut rest = Vec::new();
    let drained = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while let Some(e) = early.recv().await {
            if !e.kind.is_ephemeral() {
                rest.push(e);
            }
        }
    })
    .await;
    assert!(drained.is_ok(), "the early subscriber's stream never ended");
    first.extend(rest);
    assert!(late.len() > 12, "{}", late.len());
    assert_eq!(first, late, "the early subscriber saw every event once");
    let seqs: Vec<u64> = late.iter().map(|e| e.seq).collect();
    let expected: Vec<u64> = (1..=late.len() as u64).collect();
    assert_eq!(seqs, expected, "no gap, no duplicate");
    assert_eq!(late.last().map(|e| e.kind.name()), Some("run_finished"));
}

/// A goal whose one tool `t` asks a reviewer, and a model that calls it once, then answers.
fn one_call_asking() -> (Value, Value) {
    let doc = json!({"goal": "g", "output_schema": {"type": "object"},
        "tools": [{"_tool": "t", "_activity": "rust", "type": "object"}],
        "approval": {"policy": "ask"}});
    let turns = json!([
        sol(json!([{"_tool": "t", "k": 1}]), Value::Null),
        sol(json!([]), json!({"ok": true})),
    ]);
    (doc, turns)
}

/// Resumes `journal` as run `run_id` of `goal` with a reviewer that approves everything and a
/// tool `t` that counts its runs; waits for the end (under the paused clock a run left waiting
/// fails at once) and returns the handle and every event (live-only ones left out) seen by a
/// subscriber that came before the driver ran at all (current-thread runtime). The tool ran
/// exactly once in the resumed process.
async fn resume_approving(
    goal: Goal,
    turns: Value,
    run_id: String,
    journal: Vec<JournalEntry>,
) -> (RunHandle, Vec<Arc<Event>>) {
    let ran = Arc::new(AtomicUsize::new(0));
    let mut b = AgentBuilder::new(dagloop::RunDef::from_goal(goal).expect("defined"))
        .model(model(turns))
        .run_id(run_id)
        .approver(Arc::new(
            ScriptedApprover::new().otherwise(Decision::Approve),
        ));
    b.registry_mut().register_fn("t", counting(&ran));
    let h = b.build().expect("build").resume(journal);
    let mut early = h.subscribe_from(0);
    let r = tokio::time::timeout(Duration::from_secs(3600), h.wait())
        .await
        .expect("the resumed run was decided and finished");
    assert!(r.succeeded(), "{r:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    let mut seen = Vec::new();
    while let Some(e) = early.recv().await {
        if !e.kind.is_ephemeral() {
            seen.push(e);
        }
    }
    (h, seen)
}

/// A run resumed from a journal in which a call waits for a decision: an in-process reviewer
/// (and any subscriber that came before the driver rebuilt the run) sees that call's approval
/// request and the run goes on. Before, a reviewer that subscribed before the rebuild caught
/// up from an empty journal and the rebuilt events were never published: the run waited
/// forever. The paused clock turns such a wait into a timeout at once.
#[tokio::test(start_paused = true)]
async fn a_resumed_run_presents_calls_that_were_waiting_to_an_in_process_reviewer() {
    let dir = tempfile::tempdir().expect("dir");
    let (doc, turns) = one_call_asking();
    let ran = Arc::new(AtomicUsize::new(0));
    let mut b = AgentBuilder::new(
        dagloop::RunDef::from_goal(goal_in(dir.path(), doc.clone())).expect("defined"),
    )
    .model(model(turns.clone()))
    .external_review();
    b.registry_mut().register_fn("t", counting(&ran));
    let first = b.build().expect("build").start();
    assert_eq!(first.wait_or_idle().await, None, "waits for a decision");
    let run_id = first.run_id().to_string();
    let journal = first.journal();
    drop(first);
    let (_, seen) = resume_approving(goal_in(dir.path(), doc), turns, run_id, journal).await;
    assert_eq!(seen.first().map(|e| e.seq), Some(1), "from the run's start");
    assert!(
        seen.windows(2).all(|w| w[1].seq == w[0].seq + 1),
        "no gap, no duplicate"
    );
    assert_eq!(
        seen.iter()
            .filter(|e| matches!(e.kind, EventKind::ApprovalRequested { .. }))
            .count(),
        1,
        "the waiting call was presented once, before the restart"
    );
}

/// A call cut off by a restart (approved and started, no outcome in the journal) is presented
/// to the reviewer again, flagged `interrupted`, and runs once more only after a new decision;
/// replaying the resumed run's journal through a fresh machine gives exactly the events the
/// run published, the interrupted presentation included (late subscribers, `dagloop show` and
/// `dagloop decide` all replay).
#[tokio::test(start_paused = true)]
async fn a_call_cut_off_by_a_restart_is_presented_again_and_replays_the_same() {
    let dir = tempfile::tempdir().expect("dir");
    let (doc, turns) = one_call_asking();
    let approve = || Arc::new(ScriptedApprover::new().otherwise(Decision::Approve));
    let mut b = AgentBuilder::new(
        dagloop::RunDef::from_goal(goal_in(dir.path(), doc.clone())).expect("defined"),
    )
    .model(model(turns.clone()))
    .approver(approve());
    // The first process never sees the call end.
    b.registry_mut().register_fn("t", |_p: Value| async move {
        futures::future::pending::<Result<Value, String>>().await
    });
    let first = b.build().expect("build").start();
    let mut sub = first.subscribe_from(0);
    while let Some(e) = sub.recv().await {
        if matches!(e.kind, EventKind::Started { .. }) {
            break;
        }
    }
    let run_id = first.run_id().to_string();
    let journal = first.journal();
    drop(first);
    let g = goal_in(dir.path(), doc);
    let (h, seen) = resume_approving(g.clone(), turns, run_id.clone(), journal).await;
    let seen: Vec<Value> = seen
        .iter()
        .map(|e| serde_json::to_value(&**e).expect("json"))
        .collect();
    let asked: Vec<bool> = seen
        .iter()
        .filter(|e| e["type"] == "approval_requested")
        .map(|e| e["interrupted"] == json!(true))
        .collect();
    assert_eq!(
        asked,
        vec![false, true],
        "asked, then asked again as interrupted"
    );
    let replayed: Vec<Value> = dagloop::machine::replay(
        &run_id,
        dagloop::runs::RunDef::from_goal(g.clone())
            .expect("def")
            .config()
            .expect("config"),
        dagloop::runs::policy_for(&g, &Default::default()),
        dagloop::context::SanitizeLimits::default(),
        &h.journal(),
    )
    .iter()
    .map(|e| serde_json::to_value(e).expect("json"))
    .collect();
    assert_eq!(
        replayed, seen,
        "the journal replays to the events the run published"
    );
}

/// The goal's own schemas check a call's resolved params in a real run: a wrong type and a field
/// the tool does not have are refused, naming them; a latent call's `_output` (a meta key, left
/// out of the params check) is checked against the tool's `_output` schema, and a bad one fails
/// the call and writes nothing.
#[tokio::test(start_paused = true)]
async fn a_run_checks_params_and_latent_outputs_against_the_goals_schemas() {
    let dir = tempfile::tempdir().expect("dir");
    let g = goal_in(
        dir.path(),
        json!({"goal": "g", "output_schema": {"type": "object"},
        "tools": [
            {"_tool": "t", "_activity": "rust", "type": "object",
             "properties": {"n": {"type": "integer"}}, "required": ["n"],
             "additionalProperties": false},
            {"_tool": "note", "_output": {"type": "string"}, "type": "object",
             "properties": {}, "additionalProperties": false}
        ]}),
    );
    let turns = json!([
        sol(
            json!([
                {"_tool": "t", "n": 1, "_outputPath": "†state.a"},
                {"_tool": "t", "n": "x"},
                {"_tool": "t", "n": 2, "extra": true},
                {"_tool": "note", "_output": "kept", "_outputPath": "†state.b"},
                {"_tool": "note", "_output": 7, "_outputPath": "†state.c"}
            ]),
            Value::Null
        ),
        sol(json!([]), json!({"ok": 1}))
    ]);
    let mut b =
        AgentBuilder::new(dagloop::RunDef::from_goal(g).expect("defined")).model(model(turns));
    b.registry_mut().register_fn(
        "t",
        |p: Value| async move { Ok::<_, String>(p["n"].clone()) },
    );
    let r = b.build().expect("build").run().await;
    assert_eq!(r.status, RunStatus::Succeeded, "{r:?}");
    let statuses: Vec<&str> = r.calls.iter().map(|c| c.status.as_str()).collect();
    assert_eq!(
        statuses,
        ["done", "refused", "refused", "done", "failed"],
        "{r:?}"
    );
    let error = |i: usize| {
        r.calls[i]
            .error
            .as_ref()
            .map(Value::to_string)
            .unwrap_or_default()
    };
    assert!(
        error(1).contains("scheduler.invalid_params") && error(1).contains("/n"),
        "{}",
        error(1)
    );
    assert!(error(2).contains("extra"), "{}", error(2));
    assert!(
        error(4).contains("scheduler.invalid_latent_output"),
        "{}",
        error(4)
    );
    assert_eq!(r.state, json!({"a": 1, "b": "kept"}));
}
