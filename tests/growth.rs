//! Growth over long runs: what a run keeps in memory grows with its steps, never faster. Live
//! heap bytes are counted by the benchmarks' counting allocator (one test in the file, so nothing
//! else allocates beside it).

#[path = "../benches/support/alloc.rs"]
mod alloc;

use std::sync::Arc;

use dagloop::engine::{AgentBuilder, RunStatus};
use dagloop::goal::Goal;
use dagloop::llm::{Script, ScriptedModel};
use serde_json::{Value, json};

/// A run of `steps` steps, each one call whose 2 KB result replaces `state.latest`, then an
/// output. Returns the peak of live bytes during the run, above what was live before it.
async fn peak_of_run(steps: usize) -> isize {
    let goal = json!({
        "goal": "a long run",
        "output_schema": {"type": "object", "required": ["done"]},
        "limits": {"max_steps": steps + 5},
        "tools": [{"_tool": "fetch", "_activity": "rust", "type": "object",
                   "properties": {"i": {"type": "integer"}}, "required": ["i"]}]
    });
    let goal =
        Goal::from_json(&goal.to_string(), "growth.json".as_ref(), ".".into()).expect("goal");
    let mut turns: Vec<Value> = (0..steps)
        .map(|i| {
            json!({"solution": {"calls": [{"_tool": "fetch", "i": i, "_outputPath": "†state.latest"}],
                                "output": null}})
        })
        .collect();
    turns.push(json!({"solution": {"calls": [], "output": {"done": true}}}));
    let script = Script::parse(&json!({"turns": turns}).to_string(), "growth").expect("script");
    let mut b = AgentBuilder::new(dagloop::RunDef::from_goal(goal).expect("defined"))
        .model(Arc::new(ScriptedModel::new(script)));
    b.registry_mut()
        .register_fn("fetch", |p: Value| async move {
            Ok::<_, String>(json!({"i": p["i"], "page": "x".repeat(2048)}))
        });
    let agent = b.build().expect("agent");
    let before = alloc::live();
    alloc::reset_peak();
    let r = agent.run().await;
    assert_eq!(r.status, RunStatus::Succeeded, "{:?}", r.error);
    assert_eq!(r.steps as usize, steps + 1);
    alloc::peak() - before
}

#[tokio::test(flavor = "current_thread")]
async fn memory_per_step_stays_bounded_over_a_200_step_run() {
    // Warm-up: lazily built statics (schemas, tracing) are not the run's.
    peak_of_run(5).await;
    let at_100 = peak_of_run(100).await;
    let at_200 = peak_of_run(200).await;
    let per_step = at_200 / 200;
    println!(
        "peak bytes above the start: 100 steps {at_100}, 200 steps {at_200} ({per_step} per step)"
    );
    // Linear, not quadratic: doubling the steps at most a little more than doubles the peak
    // (a run that kept, say, every step's view of the state or every Request would quadruple).
    assert!(
        at_200 < at_100 * 5 / 2,
        "100 steps peaked at {at_100} bytes, 200 at {at_200}"
    );
    // What each step keeps: its call, its 2 KB result (journal, state log, the run's calls),
    // a few events. Far below 64 KB.
    assert!(per_step < 64 * 1024, "{per_step} bytes per step");
}
