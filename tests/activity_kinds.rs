//! An activity kind plugged in from outside the crate, through the public API only: the registry
//! checks tools of the kind before the run and runs their calls; unknown kinds and bad
//! configurations are coded errors at build time; an activity's progress reports become live
//! `call_progress` events that the journal (and so replay) never holds; an activity is handed the
//! very call its `started` event holds (no copy), and typed closures still get their params.
//! Paused tokio clock.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use dagloop::llm::{Script, ScriptedModel};
use dagloop::protocol::{Call, Tool};
use dagloop::tools::{
    ActivityContext, ActivityError, ActivityFuture, ActivityKind, Progress, Registry,
};
use dagloop::{AgentBuilder, CallId, EventKind, Goal, RunStatus};
use serde_json::{Value, json};

/// `"_activity": "upper"`: the call's `text` in capitals followed by `_upper.suffix`; reports
/// progress twice while it works.
struct Upper;

fn suffix(tool: &Tool) -> Result<String, ActivityError> {
    tool.schema
        .get("_upper")
        .and_then(|u| u.get("suffix"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| ActivityError::Config {
            tool: tool.name.clone(),
            reason: "`_upper.suffix` must be a string".into(),
        })
}

impl ActivityKind for Upper {
    fn check(&self, tool: &Tool, _base_dir: &Path) -> Result<(), ActivityError> {
        suffix(tool).map(drop)
    }

    fn run(&self, tool: &Tool, call: Arc<Call>, cx: ActivityContext) -> ActivityFuture {
        let suffix = suffix(tool);
        Box::pin(async move {
            let suffix = suffix?;
            let text = call
                .params
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or("");
            cx.progress
                .report(Progress::new(1.0, Some(2.0)).message("reading"));
            tokio::time::sleep(Duration::from_millis(50)).await;
            cx.progress.report(Progress::new(2.0, Some(2.0)));
            Ok(json!(format!("{}{suffix}", text.to_uppercase())).into())
        })
    }
}

fn goal(tools: Value) -> Goal {
    let doc = json!({"goal": "shout", "output_schema": {"type": "object"}, "tools": tools});
    Goal::from_json(&doc.to_string(), "kinds.json".as_ref(), ".".into()).expect("goal")
}

fn upper_tool() -> Value {
    json!({"_tool": "shout", "_activity": "upper", "_upper": {"suffix": "!"},
           "type": "object", "properties": {"text": {"type": "string"}}})
}

fn model() -> Arc<ScriptedModel> {
    let turns = json!([
        {"solution": {"calls": [{"_tool": "shout", "text": "hello", "_outputPath": "†state.loud"}],
                      "output": null}},
        {"solution": {"calls": [], "output": {"said": "†state.loud"}}},
    ]);
    let script = Script::parse(&json!({ "turns": turns }).to_string(), "t").expect("script");
    Arc::new(ScriptedModel::new(script))
}

fn builder(goal: Goal) -> AgentBuilder {
    let mut b =
        AgentBuilder::new(dagloop::RunDef::from_goal(goal).expect("defined")).model(model());
    b.registry_mut().register_kind("upper", Arc::new(Upper));
    b
}

#[tokio::test(start_paused = true)]
async fn a_kind_registered_from_outside_runs_its_tools_and_reports_progress() {
    let h = builder(goal(json!([upper_tool()])))
        .build()
        .expect("build")
        .start();
    let mut live = h.subscribe_from(0);
    let mut events = Vec::new();
    while let Some(e) = live.recv().await {
        events.push(e);
    }
    let r = h.wait().await;
    assert_eq!(r.status, RunStatus::Succeeded, "{r:?}");
    assert_eq!(r.output, json!({"said": "HELLO!"}));

    // Progress arrives live, for the call, between its start and its end, after the event whose
    // sequence number it carries.
    let kinds: Vec<(&str, Option<CallId>)> =
        events.iter().map(|e| (e.kind.name(), e.call)).collect();
    let at = |name: &str| kinds.iter().position(|k| *k == (name, Some(CallId(1))));
    let (started, finished) = (
        at("started").expect("started"),
        at("finished").expect("end"),
    );
    let progress: Vec<(usize, &dagloop::Event)> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind.name() == "call_progress")
        .map(|(i, e)| (i, e.as_ref()))
        .collect();
    assert_eq!(progress.len(), 2, "{kinds:?}");
    for (i, e) in &progress {
        assert!(started < *i && *i < finished, "{kinds:?}");
        assert_eq!(e.call, Some(CallId(1)));
        assert_eq!(
            e.seq,
            events[i - 1].seq,
            "live events carry the previous seq"
        );
        assert!(e.kind.is_ephemeral());
    }
    assert_eq!(
        progress[0].1.kind,
        EventKind::CallProgress {
            progress: 1.0,
            total: Some(2.0),
            message: Some("reading".into())
        }
    );
    assert_eq!(
        serde_json::to_value(progress[1].1).expect("json")["type"],
        json!("call_progress")
    );

    // Replay (a late subscriber, rebuilt from the journal) has every other event, unchanged.
    let mut replayed = Vec::new();
    let mut late = h.subscribe_from(0);
    while let Some(e) = late.recv().await {
        replayed.push(e);
    }
    let durable: Vec<_> = events.iter().filter(|e| !e.kind.is_ephemeral()).collect();
    assert_eq!(replayed.iter().collect::<Vec<_>>(), durable);
}

#[test]
fn an_unknown_kind_is_refused_when_the_agent_is_built() {
    let g = goal(json!([{"_tool": "t", "_activity": "lower", "type": "object"}]));
    let err = builder(g).build().err().expect("refused");
    assert_eq!(err.code(), "activity.unknown_kind");
    let text = err.to_string();
    assert!(
        text.contains("`lower`") && text.contains("delegate, http, rust, shell, upper"),
        "{text}"
    );
}

#[test]
fn a_kind_checks_its_tools_before_anything_runs() {
    let bad = goal(json!([{"_tool": "t", "_activity": "upper", "_upper": {}, "type": "object"}]));
    let err = builder(bad).build().err().expect("refused");
    assert_eq!(err.code(), "activity.config");
    assert!(err.to_string().contains("`_upper.suffix`"), "{err}");

    // The kind's config on a tool that does not name the kind: `_activity` was forgotten. A
    // kind's settings key is a meta key only beside its `_activity`, so the goal is refused
    // when it is read (issue 23: a meta key dagloop does not define fails closed).
    let doc = json!({"goal": "shout", "output_schema": {"type": "object"},
                     "tools": [{"_tool": "t", "_upper": {"suffix": "?"}, "type": "object"}]});
    let err =
        Goal::from_json(&doc.to_string(), "kinds.json".as_ref(), ".".into()).expect_err("refused");
    assert_eq!(err.code(), "goal.unknown_meta_key");
    assert!(
        err.to_string()
            .contains("tools[0] (t): unknown meta key `_upper`"),
        "{err}"
    );
    // A tool built in code skips the goal loader: the registry still says what is missing.
    let mut forgot = Tool::new("t");
    forgot
        .schema
        .insert("_upper".into(), json!({"suffix": "?"}));
    let mut r = Registry::new();
    r.register_kind("upper", Arc::new(Upper));
    let err = r.check(&forgot, ".".as_ref()).expect_err("refused");
    assert_eq!(err.code(), "activity.config");
    assert!(
        err.to_string()
            .contains("`_upper` is given but `_activity` is not set"),
        "{err}"
    );

    // The registry answers the same question directly; the built-in check knows no `upper`.
    let mut r = Registry::new();
    r.register_kind("upper", Arc::new(Upper));
    let tool = Tool::from_value(upper_tool()).expect("tool");
    assert_eq!(r.check(&tool, ".".as_ref()), Ok(()));
    let e = dagloop::tools::check_tool(&tool, ".".as_ref()).expect_err("unknown to validate");
    assert_eq!(e.code(), "activity.unknown_kind");
}

/// `"_activity": "keep"`: keeps the call it is handed, and how many holders it had then.
#[derive(Default)]
struct Keep(std::sync::Mutex<Vec<(Arc<Call>, usize)>>);

impl ActivityKind for Keep {
    fn run(&self, _tool: &Tool, call: Arc<Call>, _cx: ActivityContext) -> ActivityFuture {
        let holders = Arc::strong_count(&call);
        let text = call.params.get("text").cloned().unwrap_or(Value::Null);
        if let Ok(mut kept) = self.0.lock() {
            kept.push((call, holders));
        }
        Box::pin(async move { Ok(text.into()) })
    }
}

#[tokio::test(start_paused = true)]
async fn an_activity_is_handed_the_call_its_started_event_holds_and_typed_closures_get_params() {
    let tools = json!([
        {"_tool": "keep", "_activity": "keep", "type": "object",
         "properties": {"text": {"type": "string"}}},
        {"_tool": "add", "_activity": "rust", "type": "object",
         "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    ]);
    let turns = json!([
        {"solution": {"calls": [
            {"_tool": "keep", "text": "kept", "_outputPath": "†state.kept"},
            {"_tool": "add", "a": 2, "b": 3, "_outputPath": "†state.sum"}],
         "output": null}},
        {"solution": {"calls": [], "output": {"kept": "†state.kept", "sum": "†state.sum"}}},
    ]);
    let script = Script::parse(&json!({ "turns": turns }).to_string(), "t").expect("script");
    let keep = Arc::new(Keep::default());
    #[derive(serde::Deserialize)]
    struct Add {
        a: i64,
        b: i64,
    }
    let mut b = AgentBuilder::new(dagloop::RunDef::from_goal(goal(tools)).expect("defined"))
        .model(Arc::new(ScriptedModel::new(script)));
    b.registry_mut()
        .register_kind("keep", keep.clone())
        .register_fn("add", |p: Add| async move { Ok::<_, String>(p.a + p.b) });
    let h = b.build().expect("build").start();
    let mut live = h.subscribe_from(0);
    let mut events = Vec::new();
    while let Some(e) = live.recv().await {
        events.push(e);
    }
    let r = h.wait().await;
    assert_eq!(r.status, RunStatus::Succeeded, "{r:?}");
    assert_eq!(r.output, json!({"kept": "kept", "sum": 5}));

    let kept = keep.0.lock().map(|k| k.clone()).unwrap_or_default();
    let [(call, holders)] = kept.as_slice() else {
        panic!("one call kept: {kept:?}");
    };
    assert!(*holders >= 2, "shared when handed over ({holders} holders)");
    let started: Vec<bool> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Started { params, tool, .. } if &**tool == "keep" => {
                Some(params.is_of(call) && tool.is_of(call))
            }
            _ => None,
        })
        .collect();
    assert_eq!(started, vec![true], "the started event holds the very call");
}
