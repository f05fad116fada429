//! Property test (issue 23): for random goal plans, the calls `dagloop validate` calls cycles
//! (`plan.cycle`, from `check::check_goal`) are exactly the calls a run refuses for closing a
//! cycle (`call_refused` events with a cycle). Plans mix calls that are ready on arrival, calls
//! that wait, latent calls, calls whose params the tool refuses, overlapping paths (prefixes and
//! extensions) and calls that write nothing, so every way a call leaves the graph early is met.

use std::sync::Arc;

use dagloop::llm::{Script, ScriptedModel};
use dagloop::{AgentBuilder, EventKind, Goal};
use proptest::prelude::*;
use serde_json::{Value, json};

/// Paths calls read and write: `a` and `a.x` overlap, `b` and `c` do not.
const PATHS: [&str; 4] = ["state.a", "state.a.x", "state.b", "state.c"];

#[derive(Debug, Clone)]
struct PlanCall {
    latent: bool,
    reads: Vec<usize>,
    write: Option<usize>,
    /// A literal `n` of the wrong type: the tool's schema refuses the call once it is unblocked.
    bad_params: bool,
}

fn plan_call() -> impl Strategy<Value = PlanCall> {
    (
        any::<bool>(),
        proptest::collection::vec(0..PATHS.len(), 0..3),
        proptest::option::weighted(0.85, 0..PATHS.len()),
        proptest::bool::weighted(0.15),
    )
        .prop_map(|(latent, reads, write, bad_params)| PlanCall {
            latent,
            reads,
            write,
            bad_params,
        })
}

fn goal_doc(calls: &[PlanCall], initial_a: bool, initial_b: bool) -> Value {
    let mut state = serde_json::Map::new();
    if initial_a {
        state.insert("a".into(), json!({"x": 1}));
    }
    if initial_b {
        state.insert("b".into(), json!(2));
    }
    let plan: Vec<Value> = calls
        .iter()
        .map(|c| {
            let mut m = serde_json::Map::new();
            m.insert(
                "_tool".into(),
                json!(if c.latent { "guess" } else { "act" }),
            );
            let reads: Vec<Value> = c
                .reads
                .iter()
                .map(|&p| json!(format!("†{}", PATHS[p])))
                .collect();
            m.insert("in".into(), Value::Array(reads));
            m.insert(
                "n".into(),
                if c.bad_params { json!("one") } else { json!(1) },
            );
            if let Some(w) = c.write {
                m.insert("_outputPath".into(), json!(format!("†{}", PATHS[w])));
            }
            if c.latent {
                m.insert("_output".into(), json!(7));
            }
            Value::Object(m)
        })
        .collect();
    let params = json!({"in": {"type": "array"}, "n": {"type": "integer"}});
    json!({
        "goal": "Run the plan.",
        "output_schema": {"type": "object"},
        "state": state,
        "tools": [
            {"_tool": "act", "_activity": "rust", "type": "object", "properties": params},
            {"_tool": "guess", "type": "object", "properties": params, "_output": {"type": "integer"}}
        ],
        "plan": plan,
        "limits": {"max_steps": 2}
    })
}

/// The calls a run of `goal` refuses for closing a cycle, by number (from 1).
fn run_cycles(goal: Goal) -> Vec<u64> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let script = Script::parse(
            &json!({"turns": [{"solution": {"calls": [], "output": {}}}]}).to_string(),
            "answer",
        )
        .expect("script");
        let mut b = AgentBuilder::new(dagloop::RunDef::from_goal(goal).expect("defined"))
            .model(Arc::new(ScriptedModel::new(script)));
        b.registry_mut()
            .register_fn("act", |_: Value| async { Ok::<_, String>(json!(1)) });
        let h = b.build().expect("build").start();
        let mut live = h.subscribe_from(0);
        let mut refused = Vec::new();
        while let Some(e) = live.recv().await {
            if let EventKind::CallRefused { cycle, .. } = &e.kind
                && !cycle.is_empty()
                && let Some(id) = e.call
            {
                refused.push(id.0);
            }
        }
        h.wait().await;
        refused
    })
}

/// The calls `validate` calls cycles, by number (from 1).
fn validate_cycles(goal: &Goal) -> Vec<u64> {
    dagloop::check::check_goal(goal)
        .into_iter()
        .filter(|f| f.code == "plan.cycle")
        .filter_map(|f| f.call.map(|c| c as u64))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn validate_calls_cycles_what_a_run_refuses_as_cycles(
        calls in proptest::collection::vec(plan_call(), 1..8),
        initial_a in any::<bool>(),
        initial_b in any::<bool>(),
    ) {
        let doc = goal_doc(&calls, initial_a, initial_b);
        let goal = Goal::from_json(&doc.to_string(), "prop.goal.json".as_ref(), ".".into())
            .expect("goal");
        let validated = validate_cycles(&goal);
        let ran = run_cycles(goal);
        prop_assert_eq!(validated, ran, "{:#}", doc);
    }
}

/// The plan of issue 23 through the library: call 1 is ready on arrival, so call 2 writing what
/// call 1 read closes no cycle, in a run or in `validate`; swapped (call 1 waits for call 2's
/// output), it does, in both.
#[test]
fn a_call_ready_on_arrival_closes_no_cycle() {
    let inc = |read: usize, write: usize| PlanCall {
        latent: false,
        reads: vec![read],
        write: Some(write),
        bad_params: false,
    };
    // state.b is there at the start; state.c is not.
    for (calls, cycles) in [
        (vec![inc(2, 3), inc(3, 2)], vec![]),
        (vec![inc(3, 2), inc(2, 3)], vec![2]),
    ] {
        let doc = goal_doc(&calls, false, true);
        let goal = Goal::from_json(&doc.to_string(), "g.json".as_ref(), ".".into()).expect("goal");
        assert_eq!(validate_cycles(&goal), cycles, "{doc:#}");
        assert_eq!(run_cycles(goal), cycles, "{doc:#}");
    }
}

/// A plan call to a tool of the goal's MCP servers (known once they run) takes part in the
/// graph as it will in the run: here it closes a cycle with a goal tool's call. `validate` still
/// says it cannot check the name.
#[test]
fn a_call_to_an_mcp_tool_takes_part_in_the_graph() {
    let mut doc = goal_doc(&[], false, false);
    doc["mcp_servers"] = json!([{"name": "fs", "command": "srv"}]);
    doc["plan"] = json!([
        {"_tool": "write", "v": "†state.c", "_outputPath": "†state.b"},
        {"_tool": "act", "in": ["†state.b"], "n": 1, "_outputPath": "†state.c"}
    ]);
    let goal = Goal::from_json(&doc.to_string(), "g.json".as_ref(), ".".into()).expect("goal");
    let findings: Vec<(&str, Option<usize>)> = dagloop::check::check_goal(&goal)
        .iter()
        .map(|f| (f.code, f.call))
        .collect();
    assert_eq!(
        findings,
        [("plan.unknown_tool", Some(1)), ("plan.cycle", Some(2))]
    );
}
