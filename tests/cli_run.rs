//! `dagloop run` through the real binary: one test per terminal status (DESIGN.md rules 15–17),
//! with scripted models, latent tools and `http` tools served by an axum server on 127.0.0.1.
//!
//! Exit codes: 0 succeeded, 1 the run ended without a valid output. The result JSON on stdout
//! always carries `status`; a failed run also carries `error.code`.

#[path = "common/e2e.rs"]
mod harness;

use std::ffi::OsStr;
use std::time::{Duration, Instant};

use harness::{ToolServer, Workspace, call_statuses, command, finish, run_goal};
use serde_json::{Value, json};

/// Asserts a run that ended without success: exit 1, the status, the error code, no output.
fn assert_failed(run: &harness::Run, status: &str, code: &str) -> Value {
    let r = run.json();
    assert_eq!(run.code, 1, "exit code; stdout:\n{}", run.stdout);
    assert_eq!(r["status"], status, "{r:#}");
    assert_eq!(r["error"]["code"], code, "{r:#}");
    assert!(r["error"]["message"].is_string(), "{r:#}");
    assert_eq!(
        r["output"],
        Value::Null,
        "a failed run never carries an output"
    );
    r
}

fn probe(server: &ToolServer, script: &str, patch: impl FnOnce(&mut Value)) -> Workspace {
    Workspace::new(
        "probe.goal.json",
        &format!("scripts/{script}"),
        &server.base,
        patch,
    )
}

#[tokio::test]
async fn succeeded_with_http_and_latent_tools() {
    let server = ToolServer::start().await;
    let ws = Workspace::lookup(&server);
    let run = run_goal(&ws, &[]).await;
    assert_eq!(
        run.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
    let r = run.json();
    assert_eq!(r["status"], "succeeded");
    assert!(r.get("error").is_none(), "a success has no error: {r:#}");
    assert_eq!(
        r["output"],
        json!({"name": "Ada", "tier": "gold", "risk": 0.2, "summary": "Ada is a long-standing gold customer."})
    );
    // The http results and the latent call's `_output` landed in state.
    assert_eq!(
        r["state"],
        json!({
            "customer": {"id": "c1", "name": "Ada", "tier": "gold"},
            "risk": {"tier": "gold", "score": 0.2},
            "summary": {"text": "Ada is a long-standing gold customer."}
        })
    );
    assert_eq!(r["steps"], 2);
    assert_eq!(call_statuses(&r), ["done", "done", "done"]);
    let tools: Vec<&str> = r["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["tool"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["fetchCustomer", "scoreRisk", "summarise"]);
    assert!(r["usage"]["input_tokens"].as_u64().unwrap() > 0, "{r:#}");
    assert!(r["usage"]["output_tokens"].as_u64().unwrap() > 0, "{r:#}");
    // References were resolved before the requests went out: the URL template got the input's
    // id, and scoreRisk's body got the tier fetchCustomer wrote.
    assert_eq!(
        server.requests(),
        vec![
            json!({"method": "GET", "path": "/customers/c1", "body": null}),
            json!({"method": "POST", "path": "/risk", "body": {"tier": "gold"}}),
        ]
    );
}

#[tokio::test]
async fn max_steps_stops_after_the_limit() {
    let server = ToolServer::start().await;
    let ws = probe(&server, "max_steps.script.json", |g| {
        g["limits"]["max_steps"] = json!(2)
    });
    let r = assert_failed(&run_goal(&ws, &[]).await, "max_steps", "run.max_steps");
    assert_eq!(r["steps"], 2);
    // The work done before the limit is kept.
    assert_eq!(r["state"], json!({"a": "first", "b": "second"}));
    assert_eq!(call_statuses(&r), ["done", "done"]);
}

#[tokio::test]
async fn doom_loop_stops_the_third_identical_step() {
    let server = ToolServer::start().await;
    let ws = probe(&server, "doom_loop.script.json", |_| {});
    let r = assert_failed(&run_goal(&ws, &[]).await, "doom_loop", "run.doom_loop");
    assert_eq!(r["steps"], 3);
    assert_eq!(server.hits("/ping"), 3, "each repeated call still ran");
}

#[tokio::test]
async fn empty_turns_stop_after_two_empty_steps() {
    let server = ToolServer::start().await;
    let ws = probe(&server, "empty_turns.script.json", |_| {});
    let r = assert_failed(&run_goal(&ws, &[]).await, "empty_turns", "run.empty_turns");
    assert_eq!(r["steps"], 2);
    assert_eq!(r["calls"], json!([]));
}

#[tokio::test]
async fn token_budget_stops_once_spent() {
    let server = ToolServer::start().await;
    let ws = probe(&server, "token_budget.script.json", |g| {
        g["limits"]["token_budget"] = json!(100)
    });
    let r = assert_failed(
        &run_goal(&ws, &[]).await,
        "token_budget",
        "run.token_budget",
    );
    assert_eq!(r["steps"], 1);
    let used = r["usage"]["input_tokens"].as_u64().unwrap()
        + r["usage"]["output_tokens"].as_u64().unwrap();
    assert!(used > 100, "the budget was really spent: {used}");
    // The step's calls ran before the budget was checked.
    assert_eq!(r["state"], json!({"a": "first"}));
}

#[tokio::test]
async fn timeout_interrupts_a_slow_tool() {
    let server = ToolServer::start().await;
    let ws = probe(&server, "slow_tool.script.json", |g| {
        g["limits"]["timeout_s"] = json!(0.5)
    });
    let started = Instant::now();
    let r = assert_failed(&run_goal(&ws, &[]).await, "timeout", "run.timeout");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the run waited for the tool: {:?}",
        started.elapsed()
    );
    assert_eq!(server.hits("/slow"), 1);
    assert_eq!(call_statuses(&r), ["cancelled"]);
}

#[tokio::test]
async fn timeout_interrupts_a_slow_model_stream() {
    let server = ToolServer::start().await;
    // The turn takes about 30 s to stream; the run may take 0.5 s.
    let ws = probe(&server, "slow_stream.script.json", |g| {
        g["limits"]["timeout_s"] = json!(0.5)
    });
    let started = Instant::now();
    let r = assert_failed(&run_goal(&ws, &[]).await, "timeout", "run.timeout");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the run waited for the model to finish streaming: {:?}",
        started.elapsed()
    );
    assert_eq!(r["steps"], 1);
}

#[tokio::test]
async fn ctrl_c_cancels_cleanly_and_still_prints_the_result() {
    let server = ToolServer::start().await;
    let ws = probe(&server, "slow_tool.script.json", |_| {});
    let events = ws.path("events.jsonl");
    let child = command([
        OsStr::new("run"),
        ws.goal.as_os_str(),
        OsStr::new("--json"),
        OsStr::new("--events"),
        events.as_os_str(),
    ])
    .spawn()
    .expect("start dagloop");
    // Once the slow call is in flight, the run is well under way.
    server.slow_started().await;
    let pid = child.id().expect("child pid");
    let kill = std::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(kill.success());
    let run = finish(child).await;
    let r = assert_failed(&run, "cancelled", "run.cancelled");
    assert_eq!(call_statuses(&r), ["cancelled"]);
    let evs = ws.events("events.jsonl");
    let last = evs.last().expect("events were written");
    assert_eq!(last["type"], "run_finished");
    assert_eq!(last["status"], "cancelled");
    assert!(
        evs.iter()
            .any(|e| e["type"] == "cancelled" && e["call_id"] == 1),
        "the in-flight call is reported cancelled"
    );
}

#[tokio::test]
async fn ctrl_c_during_a_slow_model_stream_is_prompt() {
    let server = ToolServer::start().await;
    // The slow call arrives early in a turn that takes about 30 s to stream (rule 9: it starts
    // before the stream ends), so Ctrl-C lands while both are under way.
    let ws = probe(&server, "slow_call_slow_stream.script.json", |_| {});
    let child = command([OsStr::new("run"), ws.goal.as_os_str(), OsStr::new("--json")])
        .spawn()
        .expect("start dagloop");
    server.slow_started().await;
    let pid = child.id().expect("child pid");
    let signalled = Instant::now();
    let kill = std::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(kill.success());
    let run = finish(child).await;
    assert!(
        signalled.elapsed() < Duration::from_secs(20),
        "the run waited for the model to finish streaming: {:?}",
        signalled.elapsed()
    );
    let r = assert_failed(&run, "cancelled", "run.cancelled");
    // The second call was still being streamed: only the slow one exists, cancelled.
    assert_eq!(call_statuses(&r), ["cancelled"]);
}

#[tokio::test]
async fn invalid_output_fails_after_the_retries() {
    let server = ToolServer::start().await;
    let ws = probe(&server, "invalid_output.script.json", |g| {
        g["limits"]["max_output_retries"] = json!(1)
    });
    let r = assert_failed(
        &run_goal(&ws, &[]).await,
        "invalid_output",
        "run.invalid_output",
    );
    assert_eq!(r["steps"], 2, "one retry, then the run fails");
    let errors = r["error"]["errors"]
        .as_array()
        .expect("validation errors are listed");
    assert!(!errors.is_empty(), "{r:#}");
    let text = errors
        .iter()
        .map(|e| e.as_str().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    // The last output's problems: a float where an integer is required, an extra property.
    assert!(text.contains("4.5"), "{text}");
    assert!(text.contains("extra"), "{text}");
}

#[tokio::test]
async fn model_error_401_is_not_retried() {
    let server = ToolServer::start().await;
    let ws = probe(&server, "unauthorized.script.json", |_| {});
    let run = run_goal(&ws, &[]).await;
    let r = run.json();
    assert_eq!(run.code, 1);
    assert_eq!(r["status"], "model_error");
    // The run's code, with the provider's own code as the cause; the script's next turn (a valid
    // answer) was never requested.
    assert_eq!(r["error"]["code"], "run.model_error");
    assert_eq!(r["error"]["cause"]["code"], "llm.http_status");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("401"),
        "{r:#}"
    );
    assert_eq!(r["steps"], 1);
}

#[tokio::test]
async fn transient_model_errors_are_retried_up_to_four_attempts() {
    let server = ToolServer::start().await;
    // Three 503s then the answer: the fourth attempt succeeds.
    let ws = probe(&server, "retried.script.json", |_| {});
    let run = run_goal(&ws, &[]).await;
    assert_eq!(run.code, 0, "{}", run.stdout);
    let r = run.json();
    assert_eq!(r["output"], json!({"answer": 42}));
    assert_eq!(r["steps"], 1, "retries stay inside the step");
    // Four 503s: the attempts are spent before the answer.
    let ws = probe(&server, "retries_exhausted.script.json", |_| {});
    let run = run_goal(&ws, &[]).await;
    let r = run.json();
    assert_eq!(run.code, 1);
    assert_eq!(r["status"], "model_error");
    assert_eq!(r["error"]["code"], "run.model_error");
    assert_eq!(r["error"]["cause"]["code"], "llm.http_status");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("overloaded 4"),
        "{r:#}"
    );
}
