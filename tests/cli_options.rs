//! `dagloop run` options through the real binary: `--json`, `--events`, `--model` (and the
//! goal's relative `scripted:` path), `--approve`, and the OpenAI-compatible provider path
//! against `dagloop mock-llm` and the in-process mock.

#[path = "common/e2e.rs"]
mod harness;

use std::ffi::OsStr;

use harness::{
    MockLlm, ToolServer, Workspace, call_statuses, command, dagloop, finish, fixture, run_goal,
};
use serde_json::{Value, json};

fn probe(server: &ToolServer, script: &str, patch: impl FnOnce(&mut Value)) -> Workspace {
    Workspace::new(
        "probe.goal.json",
        &format!("scripts/{script}"),
        &server.base,
        patch,
    )
}

fn lookup(server: &ToolServer) -> Workspace {
    Workspace::lookup(server)
}

const LOOKUP_OUTPUT: &str = r#"{"name": "Ada", "tier": "gold", "risk": 0.2, "summary": "Ada is a long-standing gold customer."}"#;

#[tokio::test]
async fn json_flag_prints_only_the_result() {
    let server = ToolServer::start().await;
    let ws = lookup(&server);
    let run = run_goal(&ws, &[]).await;
    assert_eq!(run.code, 0);
    assert_eq!(run.json()["status"], "succeeded");
    // --json prints nothing but the result on stdout, and on stderr only the run id (as JSON,
    // the moment the run exists, so a crashed run can be found).
    let id: serde_json::Value = serde_json::from_str(run.stderr.trim()).expect("one JSON line");
    assert_eq!(id["run_id"], run.json()["run_id"]);
}

#[tokio::test]
async fn without_json_progress_goes_to_stderr_and_stdout_stays_json() {
    let server = ToolServer::start().await;
    let ws = lookup(&server);
    let run = dagloop([OsStr::new("run"), ws.goal.as_os_str()]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.json()["output"],
        serde_json::from_str::<Value>(LOOKUP_OUTPUT).unwrap()
    );
    // Not a terminal: plain progress lines.
    assert!(
        run.stderr.contains("[dagloop] step 1: asking the model"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("[dagloop] c1 fetchCustomer started"),
        "{}",
        run.stderr
    );
    assert!(
        !run.stderr.contains('\r'),
        "no terminal redraws when not a TTY"
    );
    // The view is not cut short: its last line is the end of the run (a race, so a few runs).
    for _ in 0..6 {
        let ws = lookup(&server);
        let run = dagloop([OsStr::new("run"), ws.goal.as_os_str()]).await;
        assert_eq!(run.code, 0);
        let last = run.stderr.lines().last().unwrap_or("");
        assert!(
            last.starts_with("[dagloop] run finished: succeeded after "),
            "{}",
            run.stderr
        );
        assert!(last.contains(" done"), "a summary of the calls: {last}");
    }
}

#[tokio::test]
async fn events_file_holds_the_whole_run_in_order() {
    let server = ToolServer::start().await;
    let ws = lookup(&server);
    let path = ws.path("events.jsonl");
    let run = run_goal(&ws, &["--events", path.to_str().unwrap()]).await;
    assert_eq!(run.code, 0);
    let evs = ws.events("events.jsonl");
    let seqs: Vec<u64> = evs
        .iter()
        .map(|e| e["seq"].as_u64().expect("seq"))
        .collect();
    assert_eq!(
        seqs,
        (1..=evs.len() as u64).collect::<Vec<_>>(),
        "seq counts from 1 without gaps"
    );
    assert_eq!(evs.first().unwrap()["type"], "run_started");
    let last = evs.last().unwrap();
    assert_eq!(last["type"], "run_finished");
    assert_eq!(last["status"], "succeeded");
    for e in &evs {
        assert!(
            e["step"].is_u64() && e["at"].is_u64(),
            "step and timestamp on {e}"
        );
    }
    // Every call's life is there, tagged with its id.
    for id in 1..=3u64 {
        let kinds: Vec<&str> = evs
            .iter()
            .filter(|e| e["call_id"] == id)
            .map(|e| e["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds.first(),
            Some(&"call_received"),
            "call {id}: {kinds:?}"
        );
        assert!(kinds.contains(&"written"), "call {id}: {kinds:?}");
    }
    let requests = evs
        .iter()
        .filter(|e| e["type"] == "request_started")
        .count();
    assert_eq!(requests, 2);
    // The timestamps never go backwards.
    assert!(
        evs.windows(2)
            .all(|w| w[0]["at"].as_u64() <= w[1]["at"].as_u64())
    );
}

#[tokio::test]
async fn events_carry_a_run_id() {
    let server = ToolServer::start().await;
    let ws = lookup(&server);
    let path = ws.path("events.jsonl");
    run_goal(&ws, &["--events", path.to_str().unwrap()]).await;
    let evs = ws.events("events.jsonl");
    let run_id = &evs[0]["run_id"];
    assert!(run_id.is_string(), "{}", evs[0]);
    assert!(evs.iter().all(|e| &e["run_id"] == run_id));
}

#[tokio::test]
async fn model_flag_overrides_the_goal_model_relative_to_the_working_directory() {
    let server = ToolServer::start().await;
    // The goal's own script would end in empty turns.
    let ws = probe(&server, "empty_turns.script.json", |_| {});
    let mut cmd = command([
        OsStr::new("run"),
        ws.goal.as_os_str(),
        OsStr::new("--json"),
        OsStr::new("--model"),
        OsStr::new("scripted:scripts/answer.script.json"),
    ]);
    cmd.current_dir(fixture(""));
    let run = finish(cmd.spawn().expect("start dagloop")).await;
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert_eq!(run.json()["output"], json!({"answer": 42}));
}

#[tokio::test]
async fn without_a_terminal_a_policy_that_asks_refuses_to_start_unless_told_what_to_do() {
    let tools = ToolServer::start().await;
    let ws = probe(&tools, "ping_then_answer.script.json", |_| {});
    let run = run_goal(&ws, &["--approve", "ask"]).await;
    assert_eq!(run.code, 2, "{}", run.stdout);
    assert_eq!(run.json()["error"]["code"], "approval.no_reviewer");
    assert!(
        run.stdout.contains("--decisions"),
        "the error names the ways out: {}",
        run.stdout
    );
    assert_eq!(tools.hits("/ping"), 0);
    // Decisions given up front, by tool.
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("decisions.json");
    std::fs::write(
        &file,
        json!({"decisions": [{"tool": "ping", "decision": "approve"}]}).to_string(),
    )
    .expect("write");
    let ws = probe(&tools, "ping_then_answer.script.json", |_| {});
    let run = run_goal(
        &ws,
        &[
            "--approve",
            "ask",
            "--decisions",
            file.to_str().expect("utf-8"),
        ],
    )
    .await;
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert_eq!(call_statuses(&run.json()), ["done"]);
    assert_eq!(run.json()["calls"][0]["decision"], "approve");
    // Journaled as the decisions file's.
    let id = run.json()["run_id"].as_str().expect("run id").to_string();
    let shown = dagloop(["show", "--json", id.as_str()]).await;
    assert_eq!(
        shown.json()["calls"][0]["decided_by"]["channel"],
        "decisions_file",
        "{}",
        shown.stdout
    );
    assert_eq!(tools.hits("/ping"), 1);
}

#[tokio::test]
async fn approve_ask_without_a_terminal_rejects_and_the_model_is_told() {
    let tools = ToolServer::start().await;
    // The model is the in-process OpenAI-compatible mock, so the requests it got can be read.
    let script =
        dagloop::llm::Script::load(&fixture("scripts/ping_then_answer.script.json")).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let llm = dagloop::llm::serve_mock(script, listener).await.unwrap();
    let ws = probe(&tools, "answer.script.json", |_| {});
    let mut cmd = command([
        OsStr::new("run"),
        ws.goal.as_os_str(),
        OsStr::new("--json"),
        OsStr::new("--model"),
        OsStr::new("openai:test"),
        OsStr::new("--approve"),
        OsStr::new("ask"),
        OsStr::new("--on-no-reviewer"),
        OsStr::new("reject"),
    ]);
    cmd.env("OPENAI_BASE_URL", llm.base_url())
        .env("OPENAI_API_KEY", "dummy");
    let run = finish(cmd.spawn().expect("start dagloop")).await;
    assert_eq!(run.code, 0, "{}", run.stdout);
    let r = run.json();
    assert_eq!(r["output"], json!({"answer": 42}));
    assert_eq!(call_statuses(&r), ["rejected"]);
    assert_eq!(tools.hits("/ping"), 0, "a rejected call never runs");
    assert_eq!(r["state"], json!({}));
    let requests = llm.requests();
    assert_eq!(requests.len(), 2);
    let second = requests[1]["messages"].to_string();
    assert!(second.contains("rejected"), "{second}");
    assert!(
        second.contains("no reviewer is attached"),
        "the reason reaches the model: {second}"
    );
}

#[tokio::test]
async fn approve_auto_overrides_an_allowlist_goal() {
    let server = ToolServer::start().await;
    let allow_notes_only =
        |g: &mut Value| g["approval"] = json!({"policy": "allowlist", "allow": ["note"]});
    // The goal's own policy asks about ping, and nobody can answer: rejected.
    let ws = probe(&server, "ping_then_answer.script.json", allow_notes_only);
    let run = run_goal(&ws, &["--on-no-reviewer", "reject"]).await;
    assert_eq!(run.code, 0);
    assert_eq!(call_statuses(&run.json()), ["rejected"]);
    assert_eq!(server.hits("/ping"), 0);
    // --approve auto runs it.
    let ws = probe(&server, "ping_then_answer.script.json", allow_notes_only);
    let run = run_goal(&ws, &["--approve", "auto"]).await;
    assert_eq!(run.code, 0);
    let r = run.json();
    assert_eq!(call_statuses(&r), ["done"]);
    assert_eq!(r["state"]["pinged"], json!({"pings": 1}));
    assert_eq!(server.requests()[0]["body"], json!({"n": 7}));
}

#[tokio::test]
async fn approve_allowlist_on_a_goal_without_one_asks_about_everything() {
    let server = ToolServer::start().await;
    let ws = probe(&server, "ping_then_answer.script.json", |_| {});
    let run = run_goal(
        &ws,
        &["--approve", "allowlist", "--on-no-reviewer", "reject"],
    )
    .await;
    assert_eq!(run.code, 0);
    assert_eq!(call_statuses(&run.json()), ["rejected"]);
    assert_eq!(server.hits("/ping"), 0);
}

#[tokio::test]
async fn openai_provider_against_mock_llm_gives_the_scripted_result() {
    let server = ToolServer::start().await;
    let scripted = run_goal(&lookup(&server), &[]).await;
    assert_eq!(scripted.code, 0);
    let mock = MockLlm::start(&fixture("lookup.script.json")).await;
    let ws = lookup(&server);
    let mut cmd = command([
        OsStr::new("run"),
        ws.goal.as_os_str(),
        OsStr::new("--json"),
        OsStr::new("--model"),
        OsStr::new("openai:test"),
    ]);
    cmd.env("OPENAI_BASE_URL", &mock.base_url)
        .env("OPENAI_API_KEY", "dummy");
    let run = finish(cmd.spawn().expect("start dagloop")).await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let (a, b) = (scripted.json(), run.json());
    assert_eq!(
        b["output"],
        serde_json::from_str::<Value>(LOOKUP_OUTPUT).unwrap()
    );
    for key in ["status", "output", "state", "steps", "calls"] {
        assert_eq!(
            a[key], b[key],
            "`{key}` differs between the scripted and the OpenAI path"
        );
    }
    // Both runs called the tools the same way.
    let reqs = server.requests();
    assert_eq!(reqs.len(), 4);
    assert_eq!(reqs[..2], reqs[2..]);
    drop(mock);
}

#[tokio::test]
async fn openai_provider_reports_an_unreachable_server_as_a_model_error() {
    let server = ToolServer::start().await;
    // Bind then drop a listener: nothing listens on that port any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let ws = probe(&server, "answer.script.json", |g| {
        g["limits"]["timeout_s"] = json!(30)
    });
    let mut cmd = command([
        OsStr::new("run"),
        ws.goal.as_os_str(),
        OsStr::new("--json"),
        OsStr::new("--model"),
        OsStr::new("openai:test"),
    ]);
    cmd.env("OPENAI_BASE_URL", format!("http://127.0.0.1:{port}/v1"));
    let run = finish(cmd.spawn().expect("start dagloop")).await;
    let r = run.json();
    assert_eq!(run.code, 1, "{r:#}");
    assert_eq!(r["status"], "model_error");
    assert_eq!(r["error"]["code"], "run.model_error");
    assert_eq!(r["error"]["cause"]["code"], "llm.transport");
}

#[tokio::test]
async fn a_scripted_model_file_may_carry_its_decisions_and_quiet_keeps_stderr_clean() {
    let tools = ToolServer::start().await;
    let ws = probe(&tools, "ping_then_answer.script.json", |_| {});
    // Put the decisions into the workspace's copy of the scripted-model file.
    let script_path = ws.goal.with_file_name("ping_then_answer.script.json");
    let mut script: Value =
        serde_json::from_str(&std::fs::read_to_string(&script_path).expect("script"))
            .expect("json");
    script["decisions"] = json!([{"tool": "ping", "decision": "reject", "reason": "scripted no"}]);
    std::fs::write(&script_path, script.to_string()).expect("write");
    let run = dagloop([
        OsStr::new("run"),
        ws.goal.as_os_str(),
        OsStr::new("--approve"),
        OsStr::new("ask"),
        OsStr::new("--quiet"),
    ])
    .await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let r = run.json();
    assert_eq!(call_statuses(&r), ["rejected"]);
    assert_eq!(r["calls"][0]["decision"], "reject");
    assert_eq!(tools.hits("/ping"), 0);
    assert!(
        !run.stderr.contains("[dagloop]"),
        "--quiet prints no progress: {}",
        run.stderr
    );
}
