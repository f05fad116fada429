//! A long text delta is parsed on a task of its own, in pieces, and the reader comes back for
//! what follows (`engine::turns`): what reaches the run is the same as if the text had been read
//! at once.

use std::sync::Arc;

use dagloop::llm::{Script, ScriptedModel};
use dagloop::{AgentBuilder, CallStatus, EventKind, Goal, RunStatus};
use serde_json::{Value, json};

fn goal() -> Goal {
    let doc = json!({
        "goal": "read a long answer",
        "output_schema": {"type": "object"},
        "tools": [{"_tool": "echo", "_activity": "rust", "type": "object",
            "properties": {"i": {"type": "integer"}, "note": {"type": "string"}}, "required": ["i"]}]
    });
    Goal::from_json(&doc.to_string(), "test.json".as_ref(), ".".into()).expect("goal")
}

/// 400 calls (a chain: each reads the one before), each note full of multi-byte characters, so
/// the answer is far longer than one piece and pieces end inside characters and references.
fn calls() -> Vec<Value> {
    (0..400)
        .map(|i| {
            let mut c = json!({"_tool": "echo", "i": i, "note": "é†ü€ ".repeat(7),
                "_outputPath": format!("†state.r{i}")});
            if i > 0 {
                c["prev"] = json!(format!("†state.r{}", i - 1));
            }
            c
        })
        .collect()
}

/// The whole answer arrives as one text delta: every call is read, checked and run, and the
/// answer counts once, with all its characters, in one `model_delta` event.
#[tokio::test(start_paused = true)]
async fn an_answer_sent_as_one_long_delta_reads_as_if_read_at_once() {
    let calls = calls();
    let text = json!({"calls": calls, "output": null}).to_string();
    assert!(text.len() > 64 * 1024, "longer than several pieces");
    let script = json!({"turns": [
        {"text": text, "chunk_chars": 1 << 22},
        {"solution": {"calls": [], "output": {}}}
    ]});
    let script = Script::parse(&script.to_string(), "test").expect("script");
    let mut b = AgentBuilder::new(dagloop::RunDef::from_goal(goal()).expect("defined"))
        .model(Arc::new(ScriptedModel::new(script)));
    b.registry_mut().register_fn(
        "echo",
        |p: Value| async move { Ok::<_, String>(p["i"].clone()) },
    );
    let handle = b.build().expect("agent").start();
    // `model_delta` events are live only: read while the run goes on.
    let mut sub = handle.subscribe_from(0);
    let reading = tokio::spawn(async move {
        let (mut deltas, mut received) = (Vec::new(), Vec::new());
        while let Some(e) = sub.recv().await {
            match &e.kind {
                EventKind::ModelDelta { chars, .. } if e.step == 1 => deltas.push(*chars),
                EventKind::CallReceived { call } => received.push(call.clone()),
                _ => {}
            }
        }
        (deltas, received)
    });
    let result = handle.wait().await;
    assert_eq!(result.status, RunStatus::Succeeded, "{:?}", result.error);
    assert_eq!(
        result.count(CallStatus::Done),
        calls.len(),
        "every call ran"
    );
    drop(handle);
    let (deltas, received) = reading.await.expect("events");
    assert_eq!(deltas, vec![text.chars().count() as u64]);
    let as_sent: Vec<dagloop::Call> = calls
        .into_iter()
        .map(|c| dagloop::Call::try_from(c).expect("call"))
        .collect();
    let as_read: Vec<dagloop::Call> = received.iter().map(|c| (**c).clone()).collect();
    assert_eq!(as_read, as_sent, "each call read as written, in order");
}

/// A model whose stream panics before its first item.
struct Panicking;

impl dagloop::llm::Model for Panicking {
    fn stream(&self, _req: &dagloop::llm::Request) -> dagloop::llm::EventStream {
        use futures::StreamExt;
        futures::stream::poll_fn(|_| -> std::task::Poll<Option<_>> {
            panic!("the provider's stream broke")
        })
        .boxed()
    }
    fn name(&self) -> String {
        "panicking".into()
    }
}

/// A stream starts on a task of its own; when that task panics, the turn ends with the model's
/// failure (the run ends, with a code) rather than the run waiting for a stream that is gone.
#[tokio::test(start_paused = true)]
async fn a_stream_that_panics_as_it_starts_ends_the_turn_with_the_models_failure() {
    let mut b = AgentBuilder::new(dagloop::RunDef::from_goal(goal()).expect("defined"))
        .model(Arc::new(Panicking));
    b.registry_mut()
        .register_fn("echo", |p: Value| async move { Ok::<_, String>(p) });
    let handle = b.build().expect("agent").start();
    let result = handle.wait().await;
    assert_eq!(result.status, RunStatus::ModelError, "{:?}", result.error);
    let code = result.error.map(|e| e.code);
    assert_eq!(code.as_deref(), Some("llm.incomplete_stream"));
}
