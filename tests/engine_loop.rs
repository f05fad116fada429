//! The outer loop's rules (spec/loop.md) through the library, on tokio's paused clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dagloop::engine::{AgentBuilder, RunResult, RunStatus};
use dagloop::goal::Goal;
use dagloop::llm::{EventStream, Jitter, Model, Request, RetryPolicy, Script, ScriptedModel};
use dagloop::protocol::Message;
use serde_json::{Value, json};

/// Records every Request and delegates to a scripted model.
struct Recording {
    inner: ScriptedModel,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl Model for Recording {
    fn stream(&self, req: &Request) -> EventStream {
        if let Ok(mut r) = self.requests.lock() {
            r.push(req.clone());
        }
        self.inner.stream(req)
    }
    fn name(&self) -> String {
        "recording".into()
    }
}

fn goal(extra: Value) -> Goal {
    let mut g = json!({
        "goal": "test goal",
        "input": {"n": 2},
        "output_schema": {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "integer"}}},
        "tools": [
            {"_tool": "double", "_activity": "rust", "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
            {"_tool": "note", "type": "object", "_output": {"type": "string"}}
        ]
    });
    if let (Value::Object(g), Value::Object(e)) = (&mut g, extra) {
        g.extend(e);
    }
    Goal::from_json(&g.to_string(), "test.json".as_ref(), ".".into()).unwrap()
}

fn turn(solution: Value) -> Value {
    json!({"solution": solution, "chunk_chars": 7, "chunk_delay_ms": 1})
}

async fn run_with(goal: Goal, turns: Vec<Value>) -> (RunResult, Vec<Request>) {
    let script = Script::parse(&json!({"turns": turns}).to_string(), "test").unwrap();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let model = Recording {
        inner: ScriptedModel::new(script),
        requests: requests.clone(),
    };
    let mut b = AgentBuilder::new(dagloop::RunDef::from_goal(goal).expect("defined"))
        .model(Arc::new(model))
        .retry(RetryPolicy {
            jitter: Jitter::None,
            ..RetryPolicy::default()
        });
    b.registry_mut()
        .register_fn("double", |p: Value| async move {
            let x = p["x"].as_i64().ok_or("x must be an integer")?;
            Ok::<_, String>(x * 2)
        });
    let result = b.build().unwrap().run().await;
    let reqs = requests.lock().unwrap().clone();
    (result, reqs)
}

fn texts(req: &Request) -> String {
    serde_json::to_string(&req.messages).unwrap()
}

#[tokio::test(start_paused = true)]
async fn rule15_calls_of_the_final_solution_run_before_the_output_is_accepted() {
    let (r, reqs) = run_with(
        goal(json!({})),
        vec![turn(json!({
            "calls": [{"_tool": "double", "x": "†input.n", "_outputPath": "†state.doubled"}],
            "output": {"answer": 4}
        }))],
    )
    .await;
    assert_eq!(r.status, RunStatus::Succeeded);
    assert_eq!(r.output, json!({"answer": 4}));
    assert_eq!(
        r.state["doubled"],
        json!(4),
        "the call ran before the run ended"
    );
    assert_eq!((r.steps, reqs.len()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn rule15_invalid_output_is_sent_back_with_errors_then_fails() {
    let bad = || turn(json!({"calls": [], "output": {"answer": "four"}}));
    let (r, reqs) = run_with(
        goal(json!({"limits": {"max_output_retries": 1}})),
        vec![bad(), bad()],
    )
    .await;
    assert_eq!(r.status, RunStatus::InvalidOutput);
    assert_eq!(r.error.as_ref().unwrap().code, "run.invalid_output");
    assert!(
        texts(&reqs[1]).contains("did not match the output schema"),
        "{}",
        texts(&reqs[1])
    );
    let (ok, _) = run_with(
        goal(json!({})),
        vec![bad(), turn(json!({"calls": [], "output": {"answer": 4}}))],
    )
    .await;
    assert_eq!(ok.status, RunStatus::Succeeded);
}

#[tokio::test(start_paused = true)]
async fn rule16_max_steps_doom_loop_and_empty_turns() {
    let same = || turn(json!({"calls": [{"_tool": "double", "x": 1}], "output": null}));
    let (r, _) = run_with(
        goal(json!({"limits": {"max_steps": 2}})),
        vec![same(), same(), same()],
    )
    .await;
    assert_eq!(r.status, RunStatus::MaxSteps);
    let (r, _) = run_with(goal(json!({})), vec![same(), same(), same(), same()]).await;
    assert_eq!((r.status, r.steps), (RunStatus::DoomLoop, 3));
    let empty = || turn(json!({"calls": [], "output": null}));
    let (r, _) = run_with(goal(json!({})), vec![empty(), empty(), empty()]).await;
    assert_eq!((r.status, r.steps), (RunStatus::EmptyTurns, 2));
}

#[tokio::test(start_paused = true)]
async fn rule16_token_budget_and_run_timeout() {
    let step =
        || turn(json!({"calls": [{"_tool": "note", "_output": "x".repeat(400)}], "output": null}));
    let (r, _) = run_with(
        goal(json!({"limits": {"token_budget": 50}})),
        vec![step(), step()],
    )
    .await;
    assert_eq!(r.status, RunStatus::TokenBudget);
    let slow = json!({"solution": {"calls": [], "output": {"answer": 1}}, "chunk_chars": 1, "chunk_delay_ms": 1000});
    let (r, _) = run_with(goal(json!({"limits": {"timeout_s": 2}})), vec![slow]).await;
    assert_eq!(r.status, RunStatus::Timeout);
    assert_eq!(r.error.as_ref().unwrap().code, "run.timeout");
}

#[tokio::test(start_paused = true)]
async fn rule16_cancellation_from_the_library() {
    let script = Script::parse(
        &json!({"turns": [{"solution": {"calls": [], "output": {"answer": 1}}, "chunk_chars": 1, "chunk_delay_ms": 1000}]}).to_string(),
        "t",
    )
    .unwrap();
    let mut b = AgentBuilder::new(dagloop::RunDef::from_goal(goal(json!({}))).expect("defined"))
        .model(Arc::new(ScriptedModel::new(script)));
    b.registry_mut()
        .register_fn("double", |x: i64| async move { Ok::<_, String>(x) });
    let agent = b.build().unwrap();
    let token = agent.cancel_token();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(3)).await;
        token.cancel();
    });
    let r = agent.run().await;
    assert_eq!(r.status, RunStatus::Cancelled);
}

#[tokio::test(start_paused = true)]
async fn rule17_provider_errors_are_retried_and_malformed_solutions_shown_back() {
    let turns = vec![
        json!({"error": {"status": 429, "retry_after_s": 1}}),
        json!({"text": "{\"calls\": [ oops", "chunk_chars": 5}),
        turn(json!({"calls": [], "output": {"answer": 7}})),
    ];
    let (r, reqs) = run_with(goal(json!({})), turns).await;
    assert_eq!(r.status, RunStatus::Succeeded);
    assert_eq!(r.steps, 2, "the 429 was retried within step 1");
    assert!(
        texts(&reqs[2]).contains(
            "Your previous response was not a valid Solution: it could not be read at byte 12"
        ),
        "{}",
        texts(&reqs[2])
    );
    let fatal = vec![json!({"error": {"status": 401}})];
    let (r, _) = run_with(goal(json!({})), fatal).await;
    assert_eq!(r.status, RunStatus::ModelError);
}

#[tokio::test(start_paused = true)]
async fn rule18_results_are_sanitised_for_the_model_but_kept_whole_in_state() {
    let blob = "QUJD".repeat(200);
    let turns = vec![
        turn(
            json!({"calls": [{"_tool": "note", "_output": blob, "_outputPath": "†state.blob"}], "output": null}),
        ),
        turn(json!({"calls": [], "output": {"answer": 1}})),
    ];
    let (r, reqs) = run_with(goal(json!({})), turns).await;
    assert_eq!(r.state["blob"], json!(blob), "state keeps the full result");
    let state_msg = reqs[1].messages.iter().find_map(|m| match m {
        Message::State { data, .. } => Some(data.clone()),
        _ => None,
    });
    assert_eq!(
        state_msg.unwrap()["blob"],
        json!("[base64 data stripped: 800 chars]")
    );
}

#[tokio::test(start_paused = true)]
async fn the_next_request_shows_the_plan_with_statuses_and_errors() {
    let turns = vec![
        turn(json!({"calls": [
            {"_tool": "double", "x": "†input.n", "_outputPath": "†state.a"},
            {"_tool": "double", "x": "oops"},
            {"_tool": "double", "x": "†state.never"}
        ], "output": null})),
        turn(json!({"calls": [], "output": {"answer": 4}})),
    ];
    let (r, reqs) = run_with(goal(json!({})), turns).await;
    assert_eq!(r.status, RunStatus::Succeeded);
    let plan = reqs[1].messages.iter().find_map(|m| match m {
        Message::Plan { plan, .. } => Some(plan.clone()),
        _ => None,
    });
    let statuses: Vec<Value> = plan
        .unwrap()
        .iter()
        .map(|c| c.to_value()["_status"].clone())
        .collect();
    assert_eq!(
        statuses,
        vec![json!("done"), json!("refused"), json!("unresolved")]
    );
    let errors = reqs[1]
        .messages
        .iter()
        .filter(|m| matches!(m, Message::Error { .. }))
        .count();
    assert_eq!(errors, 2);
}

#[tokio::test(start_paused = true)]
async fn delegates_see_only_their_params_and_granted_scopes() {
    let g = goal(json!({
        "input": {"n": 2, "secret": "internal-notes-xyz"},
        "state": {"shared": "visible-to-delegate"},
        "tools": [{
            "_tool": "helper", "_activity": "delegate", "_delegate": "anonymous",
            "description": "Answer with the doubled number.",
            "type": "object", "properties": {"x": {"type": "integer"}},
            "_output": {"type": "object", "required": ["y"], "properties": {"y": {"type": "integer"}}}
        }]
    }));
    let turns = vec![
        turn(
            json!({"calls": [{"_tool": "helper", "x": "†input.n", "_scopes": ["state"], "_outputPath": "†state.helped"}], "output": null}),
        ),
        turn(json!({"calls": [], "output": {"y": 4}})),
        turn(json!({"calls": [], "output": {"answer": 4}})),
    ];
    let (r, reqs) = run_with(g, turns).await;
    assert_eq!(r.status, RunStatus::Succeeded);
    assert_eq!(r.state["helped"], json!({"y": 4}));
    let nested = texts(&reqs[1]);
    assert!(
        nested.contains("visible-to-delegate"),
        "granted scope missing: {nested}"
    );
    assert!(
        !nested.contains("internal-notes-xyz"),
        "parent input leaked: {nested}"
    );
    assert!(
        nested.contains("\"x\":2"),
        "params are the delegate's input: {nested}"
    );
}

#[tokio::test(start_paused = true)]
async fn hooks_run_around_tools_and_can_veto() {
    use dagloop::engine::Hooks;
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let (l1, l2) = (log.clone(), log.clone());
    let hooks = Hooks {
        before_tool: Some(Arc::new(move |_t, c| {
            l1.lock().unwrap().push(format!("before {}", c.params["x"]));
            if c.params["x"] == json!(13) {
                Err("13 is unlucky".into())
            } else {
                Ok(())
            }
        })),
        after_tool: Some(Arc::new(move |_t, c, o| {
            l2.lock()
                .unwrap()
                .push(format!("after {} ok={}", c.params["x"], o.result.is_ok()));
        })),
        on_error: None,
    };
    let script = Script::parse(&json!({"turns": [
        turn(json!({"calls": [{"_tool": "double", "x": 13, "_outputPath": "†state.a || †state.err"}], "output": {"answer": 1}}))
    ]}).to_string(), "t").unwrap();
    let mut b = AgentBuilder::new(dagloop::RunDef::from_goal(goal(json!({}))).expect("defined"))
        .model(Arc::new(ScriptedModel::new(script)))
        .hooks(hooks);
    b.registry_mut()
        .register_fn("double", |p: Value| async move {
            Ok::<_, String>(p["x"].as_i64().unwrap_or(0) * 2)
        });
    let r = b.build().unwrap().run().await;
    assert_eq!(r.state["err"]["code"], json!("hook.before_tool"));
    assert_eq!(
        *log.lock().unwrap(),
        vec!["before 13".to_string(), "after 13 ok=false".to_string()]
    );
}

#[test]
fn a_tool_whose_activity_cannot_run_is_refused_before_anything_starts() {
    let script = Script::parse(&json!({"turns": []}).to_string(), "t").unwrap();
    let model = Arc::new(ScriptedModel::new(script));
    let err = AgentBuilder::new(dagloop::RunDef::from_goal(goal(json!({}))).expect("defined"))
        .model(model.clone())
        .build()
        .err()
        .unwrap();
    assert_eq!(err.code(), "agent.missing_activity");
    assert!(err.to_string().contains("`double`"), "{err}");
    let g = goal(json!({"tools": [{"_tool": "t", "_activity": "teleport", "type": "object"}]}));
    let err = AgentBuilder::new(dagloop::RunDef::from_goal(g).expect("defined"))
        .model(model)
        .build()
        .err()
        .unwrap();
    assert_eq!(err.code(), "activity.unknown_kind");
    assert!(err.to_string().contains("`teleport`"), "{err}");
}

/// A library caller's goal is defined whole before any builder exists (issue 45):
/// `RunDef::from_goal` reads every delegate goal and holds what the goal asks to the (open)
/// grants, so a goal that cannot run fails there with its definition's code: no builder, no
/// model, no activity is ever made for it.
#[test]
fn a_goal_that_cannot_be_defined_fails_in_from_goal_with_its_code() {
    let dir = tempfile::tempdir().expect("dir");
    let in_dir = |extra: Value| {
        let mut doc = json!({"goal": "g", "output_schema": {"type": "object"}});
        if let (Value::Object(d), Value::Object(e)) = (&mut doc, extra) {
            d.extend(e);
        }
        Goal::from_json(&doc.to_string(), "g.json".as_ref(), dir.path().into()).expect("goal")
    };
    // A delegate whose goal file is not there.
    let missing = in_dir(
        json!({"tools": [{"_tool": "helper", "_activity": "delegate",
        "_delegate": "no-such-goal.json", "type": "object"}]}),
    );
    let err = dagloop::RunDef::from_goal(missing).expect_err("refused");
    assert_eq!(err.code(), "agent.delegate", "{err}");
    assert!(err.to_string().contains("helper"), "{err}");
    // A delegate whose goal file is there but is not a goal.
    std::fs::write(dir.path().join("bad.json"), "{\"goal\": 1}").expect("write");
    let bad = in_dir(
        json!({"tools": [{"_tool": "helper", "_activity": "delegate",
        "_delegate": "bad.json", "type": "object"}]}),
    );
    let err = dagloop::RunDef::from_goal(bad).expect_err("refused");
    assert_eq!(err.code(), "agent.delegate", "{err}");
    // An operator's MCP server by a name nobody configured (open grants configure none).
    let unknown = in_dir(json!({"mcp_servers": [{"name": "billing"}]}));
    let err = dagloop::RunDef::from_goal(unknown).expect_err("refused");
    assert_eq!(err.code(), "grant.unknown_mcp_server", "{err}");
    // The same goal with its delegate in place is defined, and the builder takes it.
    std::fs::write(
        dir.path().join("helper.json"),
        json!({"goal": "help", "output_schema": {"type": "object"}}).to_string(),
    )
    .expect("write");
    let good = in_dir(
        json!({"tools": [{"_tool": "helper", "_activity": "delegate",
        "_delegate": "helper.json", "type": "object"}]}),
    );
    let def = dagloop::RunDef::from_goal(good).expect("defined");
    assert_eq!(def.goal().tools.len(), 1);
    let _builder = AgentBuilder::new(&def);
}

/// Timers are the machine's (spec/timers.md): no action announces a reviewer's deadline; the
/// driver asks the machine for its next one after each input and sleeps until then. On the
/// paused clock, a reviewer who never answers is timed out at the policy's 30 s, not earlier,
/// and not at the next unrelated wake-up: the run (whose own deadline is far later) ends a
/// whisker after 30 s with the default decision applied.
#[tokio::test(start_paused = true)]
async fn a_reviewer_timeout_fires_when_the_machines_next_deadline_is_due() {
    use dagloop::approval::{Decision, ScriptedApprover, after};
    let solution = json!({"calls": [{"_tool": "double", "x": 21, "_outputPath": "†state.d"}],
        "output": {"answer": "†state.d"}});
    let script = Script::parse(&json!({"turns": [turn(solution)]}).to_string(), "t").unwrap();
    let approver = ScriptedApprover::new().for_tool(
        "double",
        after(
            Duration::from_secs(3600),
            Decision::Reject {
                reason: "late".into(),
            },
        ),
    );
    let g = goal(json!({
        "limits": {"timeout_s": 7200},
        "approval": {"policy": "ask", "timeout_s": 30, "default_decision": "approve"}
    }));
    let mut b = AgentBuilder::new(dagloop::RunDef::from_goal(g).expect("defined"))
        .model(Arc::new(ScriptedModel::new(script)))
        .approver(Arc::new(approver));
    b.registry_mut()
        .register_fn("double", |p: Value| async move {
            Ok::<_, String>(p["x"].as_i64().unwrap_or(0) * 2)
        });
    let started = tokio::time::Instant::now();
    let r = b.build().unwrap().run().await;
    let took = started.elapsed();
    assert_eq!(r.status, RunStatus::Succeeded, "{r:?}");
    assert_eq!(r.output, json!({"answer": 42}));
    assert_eq!(r.calls[0].decision.as_deref(), Some("approve"), "{r:?}");
    assert!(
        took >= Duration::from_secs(30) && took < Duration::from_secs(31),
        "the reviewer's timeout fired after {took:?}"
    );
}
