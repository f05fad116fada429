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
            let parent = names
                .get(&s.parent_span_id)
                .cloned()
                .unwrap_or_else(|| "-".into());
            let links: Vec<Value> = s
                .links
                .iter()
                .map(|l| {
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

#[tokio::test(start_paused = true)]
async fn a_run_exports_the_genai_spans_with_parents_attributes_and_links() {
    let exporter = InMemorySpanExporter::default();
    assert!(dagloop::telemetry::install_exporter(
        exporter.clone(),
        false
    ));
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
    let mut b = AgentBuilder::new(goal()).model(Arc::new(ScriptedModel::new(script)));
    b.registry_mut()
        .register_fn("double", |p: Value| async move {
            let x = p["x"].as_i64().ok_or("x must be an integer")?;
            Ok::<_, String>(x * 2)
        });
    b.registry_mut().register_fn(
        "boom",
        |_p: Value| async move { Err::<Value, _>("it broke") },
    );
    let result = b.build().expect("agent").run().await;
    assert_eq!(result.status, RunStatus::Succeeded, "{:?}", result.error);
    dagloop::telemetry::flush();
    let spans = exporter.get_finished_spans().expect("spans");
    let shaped = shape(&spans);
    // Params and results are not recorded without DAGLOOP_OTEL_CONTENT=on.
    assert!(!shaped.to_string().contains("gen_ai.tool.call.arguments"));
    insta::assert_json_snapshot!(shaped);
}
