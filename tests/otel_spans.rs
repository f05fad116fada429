//! The spans a run exports (docs/observability.md), through the OpenTelemetry SDK's in-memory
//! exporter: names, parents, attributes and links pinned with insta.

#![cfg(feature = "otel")]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use dagloop::engine::{AgentBuilder, RunStatus};
use dagloop::goal::Goal;
use dagloop::llm::{Script, ScriptedModel};
use opentelemetry::Value as OtelValue;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SpanData};
use serde_json::{Value, json};

fn goal() -> Goal {
    let g = json!({
        "goal": "double twice, then ask a helper",
        "input": {"n": 2},
        "output_schema": {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "integer"}}},
        "tools": [
            {"_tool": "double", "_activity": "rust", "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
            {"_tool": "boom", "_activity": "rust", "type": "object"},
            {"_tool": "helper", "_activity": "delegate", "_delegate": "anonymous",
             "description": "Answer with y.", "type": "object", "properties": {"x": {"type": "integer"}},
             "_output": {"type": "object", "required": ["y"], "properties": {"y": {"type": "integer"}}}}
        ]
    });
    Goal::from_json(&g.to_string(), "test.json".as_ref(), ".".into()).expect("goal")
}

/// The goal's Rust tools: `double` doubles `x`, `boom` always fails.
fn register_tools(b: &mut AgentBuilder) {
    b.registry_mut()
        .register_fn("double", |p: Value| async move {
            let x = p["x"].as_i64().ok_or("x must be an integer")?;
            Ok::<_, String>(x * 2)
        });
    b.registry_mut().register_fn(
        "boom",
        |_p: Value| async move { Err::<Value, _>("it broke") },
    );
}

fn turn(solution: Value) -> Value {
    json!({"solution": solution, "chunk_chars": 7, "chunk_delay_ms": 1})
}

fn value(v: &OtelValue) -> Value {
    match v {
        OtelValue::Bool(b) => json!(b),
        OtelValue::I64(n) => json!(n),
        OtelValue::F64(f) => json!(f),
        OtelValue::String(s) => json!(s.as_str()),
        OtelValue::Array(opentelemetry::Array::String(v)) => {
            json!(v.iter().map(|s| s.as_str()).collect::<Vec<_>>())
        }
        other => json!(other.to_string()),
    }
}

/// The spans as a stable shape: ids replaced by the names of the spans they point at, attributes
/// sorted, times left out (they are the run's own, not stable).
fn shape(spans: &[SpanData]) -> Value {
    let names: HashMap<_, _> = spans
        .iter()
        .map(|s| (s.span_context.span_id(), s.name.to_string()))
        .collect();
    let trace = spans.first().map(|s| s.span_context.trace_id());
    let mut out: Vec<Value> = spans
        .iter()
        .map(|s| {
            assert_eq!(Some(s.span_context.trace_id()), trace, "one trace");
            assert!(s.end_time >= s.start_time, "{}", s.name);
            let attrs: BTreeMap<String, Value> = s
                .attributes
                .iter()
                .filter(|kv| kv.key.as_str() != "dagloop.run.id")
                .map(|kv| {
                    // Durations are the run's own; only their presence is pinned.
                    let v = if kv.key.as_str().ends_with("_ms") {
                        json!("<ms>")
                    } else {
                        value(&kv.value)
                    };
                    (kv.key.to_string(), v)
                })
                .collect();
            // Every key once: a span (or link) whose attributes repeat a key would show only
            // the last value here.
            assert_eq!(attrs.len() + 1, s.attributes.len(), "{}: {:?}", s.name, s.attributes);
            let parent = names
                .get(&s.parent_span_id)
                .cloned()
                .unwrap_or_else(|| "-".into());
            let links: Vec<Value> = s
                .links
                .iter()
                .map(|l| {
                    let keys: std::collections::BTreeSet<_> =
                        l.attributes.iter().map(|kv| kv.key.as_str()).collect();
                    assert_eq!(keys.len(), l.attributes.len(), "{}: {:?}", s.name, l.attributes);
                    json!({
                        "to": names.get(&l.span_context.span_id()).cloned().unwrap_or_else(|| "?".into()),
                        "attrs": l.attributes.iter().map(|kv| (kv.key.to_string(), value(&kv.value))).collect::<BTreeMap<_, _>>(),
                    })
                })
                .collect();
            json!({
                "name": s.name,
                "parent": parent,
                "kind": format!("{:?}", s.span_kind),
                "status": format!("{:?}", s.status),
                "attrs": attrs,
                "events": s.events.iter().map(|e| e.name.to_string()).collect::<Vec<_>>(),
                "links": links,
            })
        })
        .collect();
    out.sort_by_key(|v| (v["name"].to_string(), v["attrs"].to_string()));
    json!(out)
}

/// An in-memory exporter that takes its time over each span (200 µs), as one that encodes and
/// posts does: spans are made behind the run, which a run's end must wait for.
#[derive(Debug, Clone)]
struct Slow(InMemorySpanExporter);

impl opentelemetry_sdk::trace::SpanExporter for Slow {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = opentelemetry_sdk::error::OTelSdkResult> + Send {
        std::thread::sleep(std::time::Duration::from_micros(200) * batch.len() as u32);
        self.0.export(batch)
    }
}

/// The process's span pipeline, a (slow) in-memory exporter installed once for every test here
/// (the pipeline is the process's); each test reads its own run's trace.
fn exporter() -> InMemorySpanExporter {
    static EXPORTER: std::sync::OnceLock<InMemorySpanExporter> = std::sync::OnceLock::new();
    EXPORTER
        .get_or_init(|| {
            let e = InMemorySpanExporter::default();
            assert!(dagloop::telemetry::install_exporter(Slow(e.clone()), false));
            e
        })
        .clone()
}

/// The finished spans of `run`'s trace.
fn spans_of(exporter: &InMemorySpanExporter, run: &str) -> Vec<SpanData> {
    dagloop::telemetry::flush();
    let trace = dagloop::telemetry::trace_id(run).to_string();
    exporter
        .get_finished_spans()
        .expect("spans")
        .into_iter()
        .filter(|s| s.span_context.trace_id().to_string() == trace)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_run_exports_the_genai_spans_with_parents_attributes_and_links() {
    let exporter = exporter();
    let turns = vec![
        turn(json!({"calls": [
            {"_tool": "double", "x": "†input.n", "_outputPath": "†state.a"},
            {"_tool": "double", "x": "†state.a", "_outputPath": "†state.b"},
            {"_tool": "boom"},
            {"_tool": "helper", "x": "†state.b", "_outputPath": "†state.helped"}
        ], "output": null})),
        turn(json!({"calls": [], "output": {"y": 8}})),
        turn(json!({"calls": [], "output": {"answer": 8}})),
    ];
    let script = Script::parse(&json!({"turns": turns}).to_string(), "test").expect("script");
    let mut b = AgentBuilder::new(dagloop::RunDef::from_goal(goal()).expect("defined"))
        .model(Arc::new(ScriptedModel::new(script)));
    register_tools(&mut b);
    let result = b.run_id("otel-spans-a").build().expect("agent").run().await;
    assert_eq!(result.status, RunStatus::Succeeded, "{:?}", result.error);
    let spans = spans_of(&exporter, "otel-spans-a");
    let shaped = shape(&spans);
    // Params and results are not recorded without DAGLOOP_OTEL_CONTENT=on.
    assert!(!shaped.to_string().contains("gen_ai.tool.call.arguments"));
    insta::assert_json_snapshot!(shaped);
}

/// A run whose process stopped while a call waited for a decision, resumed by another: the
/// stopped process never ended its run span, so the resumed one reports it (status `stopped`),
/// and its own run span's `resumed_from` link points at it.
#[tokio::test(start_paused = true)]
async fn a_resumed_run_reports_the_stopped_process_run_span_its_link_points_at() {
    let exporter = exporter();
    let mut doc = serde_json::to_value(goal()).expect("goal");
    doc["approval"] = json!({"policy": "ask"});
    let g = Goal::from_json(&doc.to_string(), "test.json".as_ref(), ".".into()).expect("goal");
    let turns = vec![
        turn(
            json!({"calls": [{"_tool": "double", "x": 4, "_outputPath": "†state.a"}], "output": null}),
        ),
        turn(json!({"calls": [], "output": {"answer": "†state.a"}})),
    ];
    let script = Script::parse(&json!({"turns": turns}).to_string(), "test").expect("script");
    let build = || {
        let mut b = AgentBuilder::new(dagloop::RunDef::from_goal(g.clone()).expect("defined"))
            .model(Arc::new(ScriptedModel::new(script.clone())))
            .external_review()
            .run_id("otel-spans-resumed");
        register_tools(&mut b);
        b
    };
    let first = build().build().expect("agent").start();
    while first.awaiting().is_empty() {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let journal = first.journal();
    drop(first);
    let second = build().build().expect("agent").resume(journal);
    while second.awaiting().is_empty() {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let (call, _, _) = second.awaiting()[0].clone();
    second
        .submit(dagloop::protocol::Op::Decide {
            call,
            decision: dagloop::protocol::Decision::Approve,
            presented: None,
            presentation: None,
            by: None,
        })
        .await
        .expect("approve");
    let result = second.wait().await;
    assert_eq!(result.status, RunStatus::Succeeded, "{:?}", result.error);
    assert_eq!(result.output, json!({"answer": 8}));
    let spans = spans_of(&exporter, "otel-spans-resumed");
    let status = |s: &SpanData| {
        s.attributes
            .iter()
            .find(|kv| kv.key.as_str() == "dagloop.run.status")
            .map(|kv| kv.value.to_string())
    };
    // The run's spans (`invoke_workflow`: the goal has a delegate tool).
    let runs: Vec<&SpanData> = spans.iter().filter(|s| status(s).is_some()).collect();
    assert!(
        runs.iter().all(|s| s.name == "invoke_workflow"),
        "{runs:#?}"
    );
    assert_eq!(runs.len(), 2, "{runs:#?}");
    let stopped = runs
        .iter()
        .find(|s| status(s).as_deref() == Some("stopped"))
        .expect("the stopped process's run span");
    let resumed = runs
        .iter()
        .find(|s| status(s).as_deref() == Some("succeeded"))
        .expect("the resumed process's run span");
    assert!(stopped.links.is_empty(), "{stopped:#?}");
    assert_eq!(resumed.links.len(), 1, "{resumed:#?}");
    assert_eq!(
        resumed.links[0].span_context.span_id(),
        stopped.span_context.span_id(),
        "resumed_from points at the stopped process's run span"
    );
    // The approval span names its call as the call's span does: `gen_ai.tool.call.id` is a
    // string in both.
    let call_id = |s: &SpanData| {
        s.attributes
            .iter()
            .find(|kv| kv.key.as_str() == "gen_ai.tool.call.id")
            .map(|kv| value(&kv.value))
    };
    let approval = spans
        .iter()
        .find(|s| s.name == "approval double")
        .expect("the approval's span");
    let double = spans
        .iter()
        .find(|s| s.name == "execute_tool double")
        .expect("the call's span");
    assert_eq!(call_id(approval), Some(json!(call.0.to_string())));
    assert_eq!(call_id(approval), call_id(double));
}

/// A run reports its end only once its spans are made (they are made on a worker thread, fed
/// by the run's events): read straight after the run ends, without a flush, every call's span
/// is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_ends_only_once_every_span_of_it_is_made() {
    let exporter = exporter();
    let calls: Vec<Value> = (0..400)
        .map(|i| json!({"_tool": "double", "x": i, "_outputPath": format!("†state.d{i}")}))
        .collect();
    let turns = json!({"turns": [
        {"solution": {"calls": calls, "output": null}, "chunk_chars": 1 << 16},
        {"solution": {"calls": [], "output": {"answer": 1}}}
    ]});
    let script = Script::parse(&turns.to_string(), "test").expect("script");
    let mut b = AgentBuilder::new(dagloop::RunDef::from_goal(goal()).expect("defined"))
        .model(Arc::new(ScriptedModel::new(script)));
    register_tools(&mut b);
    let result = b
        .run_id("otel-spans-drain")
        .build()
        .expect("agent")
        .run()
        .await;
    assert_eq!(result.status, RunStatus::Succeeded, "{:?}", result.error);
    let trace = dagloop::telemetry::trace_id("otel-spans-drain").to_string();
    let spans = exporter.get_finished_spans().expect("spans");
    let mine: Vec<_> = spans
        .iter()
        .filter(|s| s.span_context.trace_id().to_string() == trace)
        .collect();
    let calls = mine
        .iter()
        .filter(|s| s.name.starts_with("execute_tool"))
        .count();
    assert_eq!(calls, 400, "every call's span, before anything was flushed");
    assert!(
        mine.iter().any(|s| s.name.starts_with("invoke_workflow")),
        "and the run's own (a workflow: the goal has a delegate)"
    );
}

/// A run built with `traced(false)` makes no span, while the process exports those of its
/// other runs: an embedding program leaves a run out of its traces.
#[tokio::test(start_paused = true)]
async fn a_run_left_out_of_the_traces_makes_no_span() {
    let exporter = exporter();
    let turns = vec![turn(json!({"calls": [
        {"_tool": "double", "x": "†input.n", "_outputPath": "†state.a"}
    ], "output": {"answer": "†state.a"}}))];
    let script = Script::parse(&json!({"turns": turns}).to_string(), "test").expect("script");
    for (id, traced) in [("otel-untraced", false), ("otel-traced", true)] {
        let mut b = AgentBuilder::new(dagloop::RunDef::from_goal(goal()).expect("defined"))
            .model(Arc::new(ScriptedModel::new(script.clone())));
        register_tools(&mut b);
        let agent = b.run_id(id).traced(traced).build().expect("agent");
        let result = agent.run().await;
        assert_eq!(result.status, RunStatus::Succeeded, "{:?}", result.error);
    }
    assert!(spans_of(&exporter, "otel-untraced").is_empty());
    assert!(
        spans_of(&exporter, "otel-traced")
            .iter()
            .any(|s| s.name.starts_with("execute_tool")),
        "the traced run's spans are there"
    );
}

/// A call that was presented and rejected never started, yet its span still links to the call
/// whose write it had read (`approval_requested` names it, `read_from`).
#[tokio::test(start_paused = true)]
async fn a_rejected_call_links_to_the_call_it_read_from() {
    let exporter = exporter();
    let mut doc = serde_json::to_value(goal()).expect("goal");
    doc["approval"] = json!({"policy": "ask"});
    let g = Goal::from_json(&doc.to_string(), "test.json".as_ref(), ".".into()).expect("goal");
    let turns = vec![
        turn(json!({"calls": [
            {"_tool": "double", "x": 4, "_outputPath": "†state.a"},
            {"_tool": "double", "x": "†state.a", "_outputPath": "†state.b"}
        ], "output": null})),
        turn(json!({"calls": [], "output": {"answer": "†state.a"}})),
    ];
    let script = Script::parse(&json!({"turns": turns}).to_string(), "test").expect("script");
    let mut b = AgentBuilder::new(dagloop::RunDef::from_goal(g).expect("defined"))
        .model(Arc::new(ScriptedModel::new(script)))
        .external_review()
        .run_id("otel-spans-rejected");
    register_tools(&mut b);
    let run = b.build().expect("agent").start();
    for decision in [
        dagloop::protocol::Decision::Approve,
        dagloop::protocol::Decision::Reject {
            reason: "no".into(),
        },
    ] {
        while run.awaiting().is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let (call, _, _) = run.awaiting()[0].clone();
        run.submit(dagloop::protocol::Op::Decide {
            call,
            decision,
            presented: None,
            presentation: None,
            by: None,
        })
        .await
        .expect("decide");
    }
    let result = run.wait().await;
    assert_eq!(result.status, RunStatus::Succeeded, "{:?}", result.error);
    let spans = spans_of(&exporter, "otel-spans-rejected");
    let with_status = |want: &str| {
        spans
            .iter()
            .find(|s| {
                s.name == "execute_tool double"
                    && s.attributes.iter().any(|kv| {
                        kv.key.as_str() == "dagloop.call.status" && kv.value.to_string() == want
                    })
            })
            .unwrap_or_else(|| panic!("a {want} call span in {spans:#?}"))
    };
    let (ran, rejected) = (with_status("ok"), with_status("rejected"));
    let linked: Vec<_> = rejected
        .links
        .iter()
        .map(|l| l.span_context.span_id())
        .collect();
    assert_eq!(linked, vec![ran.span_context.span_id()], "{rejected:#?}");
}
