//! Runs on Temporal (feature `temporal`), against Temporal's own development server started on a
//! free loopback port (`DAGLOOP_TEMPORAL`, from `scripts/setup-temporal.sh`; without it each test
//! prints SKIPPED). Workers are `dagloop worker` processes, or in-process workers for the
//! examples whose tools are Rust functions.
#![cfg(feature = "temporal")]

#[path = "common/bin.rs"]
mod bin;
mod common;
#[path = "common/model_runs.rs"]
mod model_runs;
#[path = "common/otlp.rs"]
mod otlp;
#[path = "../examples/refund/tools.rs"]
mod refund_tools;
#[path = "../examples/research/tools.rs"]
mod research_tools;
#[path = "common/temporal.rs"]
mod temporal;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use dagloop::goal::Goal;
use dagloop::runs::RunOptions;
use dagloop::temporal::{Connection, RunSpec, WorkerOptions};
use serde_json::{Value, json};
use temporal::{DevServer, WorkerProcess};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

fn server() -> Option<DevServer> {
    let s = DevServer::start();
    if s.is_none() {
        println!("SKIPPED: DAGLOOP_TEMPORAL is not set (scripts/setup-temporal.sh prints it)");
    }
    s
}

fn json_of(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A run's result without what differs between runs of the same goal.
fn comparable(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("run_id");
    }
    v
}

/// Requests per step `n`, and the idempotency keys they carried. Step 1 takes `slow_ms`.
type Seen = Arc<Mutex<BTreeMap<u64, Vec<String>>>>;

async fn counting_service(slow_ms: u64) -> (String, Seen) {
    let seen: Seen = Arc::default();
    let app = axum::Router::new()
        .route(
            "/step",
            post(
                move |State(s): State<Seen>,
                      headers: axum::http::HeaderMap,
                      Json(body): Json<Value>| async move {
                    let n = body["n"].as_u64().unwrap_or(0);
                    let key = headers
                        .get("idempotency-key")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string();
                    s.lock().expect("seen").entry(n).or_default().push(key);
                    let wait = if n == 1 { slow_ms } else { 10 };
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                    Json(json!({"n": n, "v": n * 10}))
                },
            ),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/step", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

/// A goal of four http calls (1 → 2, 3; then 4 after 2 and 3) on the counting service.
fn step_goal(dir: &Path, url: &str, approve: Option<&str>, calls: Value) -> PathBuf {
    let step = json!({"_tool": "step", "_activity": "http", "_idempotent": true,
        "_http": {"method": "POST", "url": url},
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
    let mut goal = json!({"goal": "temporal test", "model": "scripted:s.json",
        "output_schema": {"type": "object", "required": ["total"]}, "tools": [step]});
    if let Some(p) = approve {
        goal["approval"] = json!({"policy": p});
    }
    let last = calls
        .as_array()
        .and_then(|c| c.last())
        .and_then(|c| c["_outputPath"].as_str())
        .unwrap_or("†state.a")
        .to_string();
    let script = json!({"turns": [
        {"solution": {"calls": calls, "output": null}, "chunk_chars": 24, "chunk_delay_ms": 2},
        {"solution": {"calls": [], "output": {"total": last}}, "chunk_chars": 24, "chunk_delay_ms": 2}
    ]});
    std::fs::write(dir.join("s.json"), script.to_string()).expect("script");
    let path = dir.join("goal.json");
    std::fs::write(&path, goal.to_string()).expect("goal");
    path
}

fn four_calls() -> Value {
    json!([
        {"_tool": "step", "n": 1, "_outputPath": "†state.a"},
        {"_tool": "step", "n": 2, "after": "†state.a", "_outputPath": "†state.b"},
        {"_tool": "step", "n": 3, "_outputPath": "†state.c"},
        {"_tool": "step", "n": 4, "after": "†state.b && †state.c", "_outputPath": "†state.d"}
    ])
}

fn run_temporal(s: &DevServer, queue: &str, goal: &Path, extra: &[&str]) -> std::process::Output {
    run_temporal_as(bin::dagloop(), s, queue, goal, extra)
}

/// [`run_temporal`] with a command of the caller's (e.g. one whose model is a local service).
fn run_temporal_as(
    mut cmd: std::process::Command,
    s: &DevServer,
    queue: &str,
    goal: &Path,
    extra: &[&str],
) -> std::process::Output {
    cmd.args(["--no-store", "run"])
        .arg(goal)
        .args(["--json", "--engine", "temporal", "--temporal", &s.address])
        .args(["--task-queue", queue])
        .args(extra)
        .output()
        .expect("dagloop run")
}

/// `dagloop` with its `openai:` models served at `base` (no key).
fn on_openai_at(base: &str) -> std::process::Command {
    let mut cmd = bin::dagloop();
    cmd.env("OPENAI_BASE_URL", base)
        .env_remove("OPENAI_API_KEY");
    cmd
}

fn run_embedded(goal: &Path) -> Value {
    let out = bin::dagloop()
        .args(["--no-store", "run"])
        .arg(goal)
        .arg("--json")
        .output()
        .expect("dagloop run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json_of(&out)
}

fn run_id(out: &std::process::Output) -> String {
    json_of(out)["run_id"]
        .as_str()
        .expect("a run id")
        .to_string()
}

/// The workflow's history replays through this build's code; a history whose first activity
/// is of another type than the code schedules does not (so the check can fail).
async fn replays(conn: &Connection, run: &str) {
    let history = conn.history_json(run).await.expect("history");
    dagloop::temporal::replay(&history)
        .await
        .unwrap_or_else(|e| panic!("the recorded history of {run} does not replay: {e}"));
    let mut v: Value = serde_json::from_slice(&history).expect("history JSON");
    assert!(
        rename_first_activity(&mut v),
        "no activity in the history of {run}"
    );
    let tampered = serde_json::to_vec(&v).expect("json");
    assert!(
        dagloop::temporal::replay(&tampered).await.is_err(),
        "a history the code disagrees with replayed"
    );
}

/// Renames the activity type of the first activity scheduled in a history (JSON).
fn rename_first_activity(v: &mut Value) -> bool {
    match v {
        Value::Object(o) => {
            for key in ["activityType", "activity_type"] {
                if let Some(Value::Object(t)) = o.get_mut(key)
                    && t.contains_key("name")
                {
                    t.insert("name".into(), json!("somethingElse"));
                    return true;
                }
            }
            o.values_mut().any(rename_first_activity)
        }
        Value::Array(a) => a.iter_mut().any(rename_first_activity),
        _ => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_run_through_workers_to_the_embedded_results_and_replay() {
    let Some(s) = server() else { return };
    let conn = s.connect().await;
    // The delegate example (a nested agent with its own model), through `dagloop worker`.
    let _w = WorkerProcess::start(bin::dagloop(), &s, "examples");
    let goal = examples().join("delegate/goal.json");
    let out = run_temporal(&s, "examples", &goal, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let on_temporal = json_of(&out);
    assert_eq!(
        comparable(on_temporal.clone()),
        comparable(run_embedded(&goal))
    );
    let id = run_id(&out);
    let show = bin::dagloop()
        .args([
            "show",
            &id,
            "--json",
            "--engine",
            "temporal",
            "--temporal",
            &s.address,
        ])
        .output()
        .expect("show");
    let shown = json_of(&show);
    assert_eq!(shown["status"], "succeeded", "{shown}");
    assert_eq!(shown["calls"].as_array().map(Vec::len), Some(2), "{shown}");
    // Temporal's own CLI asks the same query (README: `--type describe`).
    let cli = std::env::var("DAGLOOP_TEMPORAL").expect("DAGLOOP_TEMPORAL");
    let asked = std::process::Command::new(cli)
        .args([
            "workflow",
            "query",
            "--address",
            &s.address,
            "--workflow-id",
            &id,
        ])
        .args(["--type", "describe", "--output", "json"])
        .output()
        .expect("temporal workflow query");
    let text = String::from_utf8_lossy(&asked.stdout);
    assert!(
        asked.status.success()
            && text.contains("\"journal_entries\"")
            && text.contains("succeeded"),
        "{text}{}",
        String::from_utf8_lossy(&asked.stderr)
    );
    replays(&conn, &id).await;

    // The research and refund examples' tools are Rust functions: a program runs its own
    // worker, with them registered.
    let mut registry = dagloop::tools::Registry::new();
    research_tools::register(&mut registry);
    refund_tools::register(&mut registry);
    let opts = WorkerOptions {
        address: s.address.clone(),
        namespace: "default".into(),
        task_queue: "research".into(),
        access: Default::default(),
        webhook: None,
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    // The worker's future is not `Send`: it gets a thread and a runtime of its own.
    let worker = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(dagloop::temporal::run_worker(&opts, registry, async {
            let _ = stop_rx.await;
        }))
    });
    let path = examples().join("research/goal.json");
    let goal = Goal::load(&path).expect("research goal");
    let spec = RunSpec::new("research-1", &goal, RunOptions::default());
    conn.start(spec, "research").await.expect("start");
    let got = conn.result("research-1").await.expect("result");
    let mut agent = dagloop::engine::AgentBuilder::new(
        dagloop::RunDef::from_goal(Goal::load(&path).expect("goal")).expect("defined"),
    );
    research_tools::register(agent.registry_mut());
    let embedded = agent.build().expect("agent").run().await;
    assert!(got.succeeded(), "{got:?}");
    assert_eq!(got.output, embedded.output);
    // The three searches append to `results` as they finish: which finishes first is a race
    // on either engine (the state's rule is last write wins), so that list is compared as a
    // set; everything else is compared as it is.
    let sorted = |mut v: Value| {
        if let Some(r) = v["results"].as_array_mut() {
            r.sort_by_key(|x| x.to_string());
        }
        v
    };
    assert_eq!(sorted(got.state.clone()), sorted(embedded.state.clone()));
    assert_eq!(got.calls, embedded.calls);
    replays(&conn, "research-1").await;
    let path = examples().join("refund/goal.json");
    let goal = Goal::load(&path).expect("refund goal");
    conn.start(
        RunSpec::new("refund-1", &goal, RunOptions::default()),
        "research",
    )
    .await
    .expect("start");
    let got = conn.result("refund-1").await.expect("result");
    let mut agent = dagloop::engine::AgentBuilder::new(
        dagloop::RunDef::from_goal(Goal::load(&path).expect("goal")).expect("defined"),
    );
    refund_tools::register(agent.registry_mut());
    let embedded = agent.build().expect("agent").run().await;
    assert!(got.succeeded(), "{got:?}");
    assert_eq!(
        (&got.output, &got.state, &got.calls, got.steps),
        (
            &embedded.output,
            &embedded.state,
            &embedded.calls,
            embedded.steps
        )
    );
    let _ = stop_tx.send(());
    let _ = tokio::task::spawn_blocking(move || worker.join()).await;

    // The mcp-files example: its MCP server started by the worker (shared between the runs it
    // serves), each engine on a fresh directory.
    let Ok(npm) = std::env::var("DAGLOOP_MCP_NPM") else {
        println!(
            "SKIPPED the mcp-files example: DAGLOOP_MCP_NPM is not set (scripts/setup-mcp.sh)"
        );
        return;
    };
    let (on_temporal_dir, embedded_dir) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let mut worker = bin::dagloop();
    worker
        .env("DAGLOOP_MCP_NPM", &npm)
        .env("DAGLOOP_MCP_FILES_DIR", on_temporal_dir.path());
    let _files = WorkerProcess::start(worker, &s, "files");
    let goal = examples().join("mcp-files/goal.json");
    let out = bin::dagloop()
        .env("DAGLOOP_MCP_NPM", &npm)
        .env("DAGLOOP_MCP_FILES_DIR", on_temporal_dir.path())
        .args(["--no-store", "run"])
        .arg(&goal)
        .args([
            "--json",
            "--engine",
            "temporal",
            "--temporal",
            &s.address,
            "--task-queue",
            "files",
        ])
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let embedded = bin::dagloop()
        .env("DAGLOOP_MCP_NPM", &npm)
        .env("DAGLOOP_MCP_FILES_DIR", embedded_dir.path())
        .args(["--no-store", "run"])
        .arg(&goal)
        .arg("--json")
        // edit_file and move_file can ask a reviewer (never called): no terminal here.
        .args(["--on-no-reviewer", "reject"])
        .output()
        .expect("run");
    // The directory's path is in the listing the server returns; it is the only difference.
    let text = |o: &std::process::Output, dir: &Path| {
        String::from_utf8_lossy(&o.stdout).replace(&dir.display().to_string(), "DIR")
    };
    let a: Value = serde_json::from_str(&text(&out, on_temporal_dir.path())).expect("json");
    let b: Value = serde_json::from_str(&text(&embedded, embedded_dir.path())).expect("json");
    assert_eq!(comparable(a), comparable(b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_run_is_replaced_and_no_completed_call_runs_twice() {
    let Some(s) = server() else { return };
    let conn = s.connect().await;
    let dir = tempfile::tempdir().expect("dir");
    let (url, seen) = counting_service(3_000).await;
    let goal = step_goal(dir.path(), &url, None, four_calls());
    // Both workers export spans to one collector: the run's trace is one, whichever worker
    // ran what.
    let (collector, got) = otlp::receiver().await;
    let exporting = || {
        let mut c = bin::dagloop();
        c.env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector)
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .env("OTEL_METRICS_EXPORTER", "none")
            .env_remove("OTEL_SDK_DISABLED")
            .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL");
        c
    };
    let mut first = WorkerProcess::start(exporting(), &s, "crash");
    let out = run_temporal(&s, "crash", &goal, &["--detach"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = run_id(&out);
    // Call 1 is on the service (it takes 3 s) and call 3 is done: the worker dies now.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let s1 = seen.lock().expect("seen").clone();
        if s1.contains_key(&1) && s1.contains_key(&3) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the calls never came");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    first.kill();
    let _second = WorkerProcess::start(exporting(), &s, "crash");
    let result = tokio::time::timeout(Duration::from_secs(120), conn.result(&id))
        .await
        .expect("the run ended")
        .expect("result");
    assert!(result.succeeded(), "{result:?}");
    assert_eq!(result.output, json!({"total": {"n": 4, "v": 40}}));
    let seen = seen.lock().expect("seen").clone();
    // Completed calls ran once; call 1, lost with its worker, ran again with the same key.
    for n in [2, 3, 4] {
        assert_eq!(seen[&n].len(), 1, "call {n} ran {:?}", seen[&n]);
    }
    let keys = &seen[&1];
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(keys.iter().all(|k| k == &format!("{id}:1")), "{keys:?}");
    // The journal says so too: call 1 was interrupted once, then done.
    let snap = conn.snapshot(&id).await.expect("snapshot");
    let interrupted = snap
        .journal
        .iter()
        .filter(|e| matches!(e.input, dagloop::machine::RunInput::Interrupted { .. }))
        .count();
    assert_eq!(interrupted, 1);
    replays(&conn, &id).await;
    trace_reported_once(&got, &id).await;
}

/// The run's trace as the worker that ended it reported it: one trace (the run's id), a tree
/// (every parent is a span of it), the run's span succeeded, each call's `execute_tool` span
/// once and call 1 marked interrupted, each model turn with its finish reason.
async fn trace_reported_once(got: &otlp::Received, run: &str) {
    let trace = dagloop::telemetry::trace_id(run).to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let spans = loop {
        let spans = otlp::spans(got);
        if spans.iter().any(|s| s.name.starts_with("invoke_agent")) {
            break spans;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no run span reached the collector: {spans:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(spans.iter().all(|s| s.trace == trace), "{spans:?}");
    let ids: std::collections::BTreeSet<&str> = spans.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids.len(), spans.len(), "a span reported twice: {spans:?}");
    let roots: Vec<_> = spans.iter().filter(|s| s.parent.is_empty()).collect();
    assert_eq!(roots.len(), 1, "{roots:?}");
    assert_eq!(
        roots[0].attrs["dagloop.run.status"], "succeeded",
        "{roots:?}"
    );
    assert!(
        spans
            .iter()
            .all(|s| s.parent.is_empty() || ids.contains(s.parent.as_str())),
        "a span whose parent is not in the trace: {spans:?}"
    );
    let calls: BTreeMap<String, &otlp::Span> = spans
        .iter()
        .filter(|s| s.name == "execute_tool step")
        .map(|s| (s.attrs["gen_ai.tool.call.id"].to_string(), s))
        .collect();
    assert_eq!(
        calls.len(),
        spans
            .iter()
            .filter(|s| s.name == "execute_tool step")
            .count(),
        "a call reported twice: {spans:?}"
    );
    assert_eq!(calls.len(), 4, "{spans:?}");
    assert!(
        calls
            .values()
            .all(|s| s.attrs["dagloop.call.status"] == "ok")
    );
    let interrupted: Vec<_> = calls
        .values()
        .filter(|s| s.attrs.get("dagloop.call.interrupted") == Some(&json!(true)))
        .collect();
    assert_eq!(interrupted.len(), 1, "{spans:?}");
    let chats: Vec<_> = spans
        .iter()
        .filter(|s| s.name.starts_with("chat"))
        .collect();
    assert_eq!(chats.len(), 2, "{spans:?}");
    // A script is named by its file, not by its path on the worker's disk.
    assert!(chats.iter().all(|s| s.name == "chat s.json"), "{chats:?}");
    assert!(
        chats
            .iter()
            .all(|s| s.attrs["gen_ai.response.finish_reasons"] == json!(["stop"])),
        "{chats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_share_a_batch_of_twenty_runs() {
    let Some(s) = server() else { return };
    let conn = s.connect().await;
    let dir = tempfile::tempdir().expect("dir");
    let (url, seen) = counting_service(10).await;
    let goal_path = step_goal(dir.path(), &url, None, four_calls());
    let goal = Goal::load(&goal_path).expect("goal");
    let a = WorkerProcess::start(bin::dagloop(), &s, "batch");
    let b = WorkerProcess::start(bin::dagloop(), &s, "batch");
    // Both must be polling before the batch starts, or the first up may take all of it.
    s.wait_for_pollers("batch", &[&a, &b]);
    let ids: Vec<String> = (0..20).map(|i| format!("batch-{i}")).collect();
    for id in &ids {
        let spec = RunSpec::new(id.clone(), &goal, RunOptions::default());
        conn.start(spec, "batch").await.expect("start");
    }
    let mut identities = std::collections::BTreeSet::new();
    for id in &ids {
        let r = tokio::time::timeout(Duration::from_secs(120), conn.result(id))
            .await
            .expect("ended")
            .expect("result");
        assert!(r.succeeded(), "{id}: {r:?}");
        assert_eq!(r.output, json!({"total": {"n": 4, "v": 40}}));
        let history =
            String::from_utf8(conn.history_json(id).await.expect("history")).expect("utf-8");
        for pid in [a.pid(), b.pid()] {
            if history.contains(&format!("dagloop@{pid}")) {
                identities.insert(pid);
            }
        }
    }
    assert_eq!(identities.len(), 2, "both workers took part");
    let seen = seen.lock().expect("seen");
    assert!(
        seen.values().all(|k| k.len() == 20),
        "every call of every run ran once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_is_decided_by_update_after_the_worker_restarted() {
    let Some(s) = server() else { return };
    let conn = s.connect().await;
    let dir = tempfile::tempdir().expect("dir");
    let (url, seen) = counting_service(10).await;
    let calls = json!([{"_tool": "step", "n": 1, "_outputPath": "†state.a"}]);
    let goal = step_goal(dir.path(), &url, Some("ask"), calls);
    let mut first = WorkerProcess::start(bin::dagloop(), &s, "review");
    let out = run_temporal(&s, "review", &goal, &["--detach"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = run_id(&out);
    let show = || {
        json_of(
            &bin::dagloop()
                .args([
                    "show",
                    &id,
                    "--json",
                    "--engine",
                    "temporal",
                    "--temporal",
                    &s.address,
                ])
                .output()
                .expect("show"),
        )
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while show()["calls"][0]["status"] != "awaiting_approval" {
        assert!(
            std::time::Instant::now() < deadline,
            "never awaited: {}",
            show()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    first.kill();
    let _second = WorkerProcess::start(bin::dagloop(), &s, "review");
    let decide = |call: &str| {
        bin::dagloop()
            .args([
                "decide",
                &id,
                call,
                "--engine",
                "temporal",
                "--temporal",
                &s.address,
            ])
            .arg("approve")
            .output()
            .expect("decide")
    };
    // Rule 21: a decision that does not apply is refused, with the op's code.
    let refused = decide("7");
    assert_eq!(refused.status.code(), Some(1));
    assert_eq!(json_of(&refused)["error"]["code"], "op.unknown_call");
    let ok = decide("1");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );
    let r = tokio::time::timeout(Duration::from_secs(120), conn.result(&id))
        .await
        .expect("ended")
        .expect("result");
    assert!(r.succeeded(), "{r:?}");
    assert_eq!(r.calls[0].decision.as_deref(), Some("approve"));
    assert_eq!(seen.lock().expect("seen")[&1].len(), 1);
    // Decided again once the run is over: refused.
    let late = decide("1");
    assert_eq!(late.status.code(), Some(1));
    // `show` of a run Temporal does not know: its code, and exit 2 as for an unknown stored run.
    let unknown = bin::dagloop()
        .args([
            "show",
            "run-nobody-started",
            "--json",
            "--engine",
            "temporal",
        ])
        .args(["--temporal", &s.address])
        .output()
        .expect("show");
    assert_eq!(unknown.status.code(), Some(2));
    assert_eq!(
        json_of(&unknown)["error"]["code"],
        "temporal.unknown_run",
        "{}",
        String::from_utf8_lossy(&unknown.stderr)
    );
    replays(&conn, &id).await;
}

/// Standing approvals reach a Temporal run by update (spec/approval.md R13): `dagloop allow
/// --engine temporal --tool step --when SCHEMA` approves call 1 only; `revoke` is journaled;
/// `allow --call 2 --with-dependents` approves call 2 and the run ends. Each step ran once, and the
/// workflow's history replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standing_approvals_and_revokes_reach_a_temporal_run_by_update() {
    let Some(s) = server() else { return };
    let conn = s.connect().await;
    let dir = tempfile::tempdir().expect("dir");
    let (url, seen) = counting_service(10).await;
    let calls = json!([{"_tool": "step", "n": 1, "_outputPath": "†state.a"},
                       {"_tool": "step", "n": 2, "_outputPath": "†state.b"}]);
    let goal = step_goal(dir.path(), &url, Some("ask"), calls);
    let _worker = WorkerProcess::start(bin::dagloop(), &s, "standing");
    let out = run_temporal(&s, "standing", &goal, &["--detach"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = run_id(&out);
    let cmd = |args: &[&str]| {
        bin::dagloop()
            .args(args)
            .args(["--engine", "temporal", "--temporal", &s.address])
            .output()
            .expect("dagloop")
    };
    let until = |what: &str, pred: &dyn Fn(&Value) -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let v = json_of(&cmd(&["show", &id, "--json"]));
            if pred(&v) {
                return v;
            }
            assert!(std::time::Instant::now() < deadline, "never {what}: {v}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    until("two calls awaiting", &|v| {
        v["awaiting"].as_array().map(Vec::len) == Some(2)
    });
    let ok = |out: std::process::Output| {
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    ok(cmd(&[
        "allow",
        &id,
        "--tool",
        "step",
        "--when",
        r#"{"properties": {"n": {"maximum": 1}}}"#,
    ]));
    until("call 1 approved by g1", &|v| {
        v["standing"][0]["calls"] == json!([1])
    });
    ok(cmd(&["revoke", &id, "g1"]));
    until("g1 revoked", &|v| v["standing"][0]["revoked"] == true);
    ok(cmd(&["allow", &id, "--call", "2", "--with-dependents"]));
    let r = tokio::time::timeout(Duration::from_secs(120), conn.result(&id))
        .await
        .expect("ended")
        .expect("result");
    assert!(r.succeeded(), "{r:?}");
    let decided: Vec<Option<&str>> = r.calls.iter().map(|c| c.decision.as_deref()).collect();
    assert_eq!(decided, [Some("approve"), Some("approve")], "{r:?}");
    {
        let seen = seen.lock().expect("seen");
        assert_eq!((seen[&1].len(), seen[&2].len()), (1, 1));
    }
    // The run is over: a revoke is refused with the op's code.
    let late = cmd(&["revoke", &id, "g2"]);
    assert_eq!(
        late.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&late.stdout)
    );
    replays(&conn, &id).await;
}

/// A history's events in order, as (event id, kind, attributes, seconds into the day), the kind
/// being the name of the attributes' variant in lower camel case
/// (`activityTaskScheduledEventAttributes`). The history JSON is the SDK's serde form;
/// protobuf's JSON form is read too.
fn history_events(v: &Value) -> Vec<(String, String, Value, f64)> {
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let lower_first = |k: &str| {
        let mut c = k.chars();
        c.next()
            .map(|f| f.to_lowercase().chain(c).collect::<String>())
            .unwrap_or_default()
    };
    let Some(events) = v["events"].as_array() else {
        return Vec::new();
    };
    events
        .iter()
        .filter_map(|e| {
            let id = text(if e["event_id"].is_null() {
                &e["eventId"]
            } else {
                &e["event_id"]
            });
            // "2026-11-24T13:44:06.062637631Z": the time of day is enough within one test.
            let time = text(if e["event_time"].is_null() {
                &e["eventTime"]
            } else {
                &e["event_time"]
            });
            let clock = time.split('T').nth(1)?.trim_end_matches('Z');
            let mut hms = clock.split(':').map(|x| x.parse::<f64>().ok());
            let at = hms.next()?? * 3600.0 + hms.next()?? * 60.0 + hms.next()??;
            let holder = e.get("attributes").unwrap_or(e).as_object()?;
            let (k, attrs) = holder
                .iter()
                .find(|(k, _)| k.ends_with("EventAttributes"))?;
            Some((id, lower_first(k), attrs.clone(), at))
        })
        .collect()
}

/// A field of a history event's attributes, under its snake_case or camelCase name.
fn field<'a>(attrs: &'a Value, snake: &str, camel: &str) -> &'a Value {
    if attrs[snake].is_null() {
        &attrs[camel]
    } else {
        &attrs[snake]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_starts_on_temporal_while_the_model_still_streams() {
    // Rule 9 on Temporal: the model activity signals each call as it closes, so the call's
    // activity is scheduled before the model's turn ends (read off the recorded history).
    let Some(s) = server() else { return };
    let conn = s.connect().await;
    let dir = tempfile::tempdir().expect("dir");
    let (url, _seen) = counting_service(10).await;
    let calls = json!([
        {"_tool": "step", "n": 1, "_outputPath": "†state.a"},
        {"_tool": "step", "n": 3, "note": "a long tail the model is still writing when call 1 has closed", "_outputPath": "†state.c"},
        {"_tool": "step", "n": 2, "after": "†state.a && †state.c", "_outputPath": "†state.b"}
    ]);
    let goal = step_goal(dir.path(), &url, None, calls.clone());
    // About 2 s of streaming after call 1 closes: 4 characters every 40 ms.
    let script = json!({"turns": [
        {"solution": {"calls": calls, "output": null}, "chunk_chars": 4, "chunk_delay_ms": 40},
        {"solution": {"calls": [], "output": {"total": "†state.b"}}}
    ]});
    std::fs::write(dir.path().join("s.json"), script.to_string()).expect("script");
    let _worker = WorkerProcess::start(bin::dagloop(), &s, "stream");
    let out = run_temporal(&s, "stream", &goal, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json_of(&out)["output"], json!({"total": {"n": 2, "v": 20}}));
    let id = run_id(&out);
    let history: Value =
        serde_json::from_slice(&conn.history_json(&id).await.expect("history")).expect("json");
    let events = history_events(&history);
    let mut names = BTreeMap::new();
    let mut first_tool = None;
    let mut first_turn_done = None;
    for (i, (eid, kind, attrs, _)) in events.iter().enumerate() {
        if kind == "activityTaskScheduledEventAttributes" {
            let name = field(attrs, "activity_type", "activityType")["name"]
                .as_str()
                .unwrap_or("")
                .to_string();
            if name.contains("tool_call") && first_tool.is_none() {
                first_tool = Some(i);
            }
            names.insert(eid.clone(), name);
        }
        if kind == "activityTaskCompletedEventAttributes" {
            let sched = match field(attrs, "scheduled_event_id", "scheduledEventId") {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            if names.get(&sched).is_some_and(|n| n.contains("model_turn"))
                && first_turn_done.is_none()
            {
                first_turn_done = Some(i);
            }
        }
    }
    let (Some(tool), Some(turn)) = (first_tool, first_turn_done) else {
        panic!("no tool call or no finished model turn in the history: {names:?}")
    };
    assert!(
        tool < turn,
        "the first call was scheduled (event {tool}) only after the model's turn ended (event {turn})"
    );
    // Well before: the model had about 2 s of stream left after call 1 closed.
    let ahead = events[turn].3 - events[tool].3;
    assert!(
        ahead > 1.0,
        "call 1 was scheduled only {ahead:.3} s before the model's turn ended"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_cancels_the_workflow_and_the_run_ends_cancelled() {
    let Some(s) = server() else { return };
    let conn = s.connect().await;
    let dir = tempfile::tempdir().expect("dir");
    let (url, seen) = counting_service(60_000).await;
    let goal = step_goal(dir.path(), &url, None, four_calls());
    let _worker = WorkerProcess::start(bin::dagloop(), &s, "cancel");
    let child = bin::dagloop()
        .args(["--no-store", "run"])
        .arg(&goal)
        .args(["--json", "--engine", "temporal", "--temporal", &s.address])
        .args(["--task-queue", "cancel"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("dagloop run");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !seen.lock().expect("seen").contains_key(&1) {
        assert!(std::time::Instant::now() < deadline, "call 1 never came");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = std::time::Instant::now();
    let sent = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill -INT");
    assert!(sent.success());
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("join")
        .expect("wait");
    // The run did not wait for call 1's minute on the service.
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json_of(&out);
    assert_eq!(v["status"], "cancelled", "{v}");
    assert_eq!(v["error"]["code"], "run.cancelled", "{v}");
    // The workflow itself ended, with the same result.
    let id = v["run_id"].as_str().expect("run id").to_string();
    let r = conn.result(&id).await.expect("result");
    assert_eq!(r.status.as_str(), "cancelled");
    // Call 4 (after 2 and 3, which wait on call 1) never ran.
    assert!(!seen.lock().expect("seen").contains_key(&4));
}

/// A spec that makes no machine (here a goal that does not load) ends the workflow at once as
/// a run of its own ending, `setup_failed`, whose cause is the goal's error: not a
/// `model_error`, since no model was asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_goal_that_does_not_load_ends_the_run_setup_failed() {
    let Some(s) = server() else { return };
    let conn = s.connect().await;
    let w = WorkerProcess::start(bin::dagloop(), &s, "setup");
    s.wait_for_pollers("setup", &[&w]);
    let spec = RunSpec::of_record(dagloop::store::RunRecord {
        id: "setup-1".into(),
        created_at: 0,
        goal: json!({"goal": "x", "no_such_field": true}),
        base_dir: ".".into(),
        options: json!({}),
    });
    conn.start(spec, "setup").await.expect("start");
    let r = tokio::time::timeout(Duration::from_secs(60), conn.result("setup-1"))
        .await
        .expect("ended")
        .expect("result");
    assert_eq!(r.status.as_str(), "setup_failed", "{r:?}");
    let err = r.error.expect("an error");
    assert_eq!(err.code, "run.setup_failed", "{err:?}");
    assert_eq!(
        err.cause.as_ref().and_then(|c| c["code"].as_str()),
        Some("goal.invalid"),
        "{err:?}"
    );
    assert_eq!(r.steps, 0);
}

/// On Temporal, memory is searched before each step by a worker (an activity: the workflow
/// reads no folder), and its answer reaches the model: step 1's request shows the note about
/// Ada, step 2's (searched for what step 1's call wrote) the note about the telescope, which
/// step 1's did not. The recorded history replays with no folder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_searches_memory_before_each_step_on_temporal() {
    use model_runs::{
        TELESCOPE_NOTE, TINY, answer, assert_each_step_recalls_what_the_step_before_brought,
        final_output, memory_text, telescope_answer,
    };
    let Some(s) = server() else { return };
    let conn = s.connect().await;
    let model = common::serve(vec![telescope_answer(), answer(final_output())]).await;
    let dir = tempfile::tempdir().expect("dir");
    let notes = dir.path().join("notes");
    std::fs::create_dir_all(&notes).expect("notes");
    for i in 0..20 {
        std::fs::write(
            notes.join(format!("shipment-{i:02}.md")),
            format!("# Shipment {i}\n\nThe warehouse shipped {i} crates of apples.\n"),
        )
        .expect("note");
    }
    std::fs::write(
        notes.join("ada-greeting.md"),
        "# Greeting Ada\n\nAda likes a greeting that calls her Countess Lovelace.\n",
    )
    .expect("note");
    std::fs::write(notes.join("telescope.md"), TELESCOPE_NOTE).expect("note");
    let mut goal: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(TINY)).expect("tiny"),
    )
    .expect("goal");
    goal["memory"] = json!({"path": "notes"});
    let goal_path = dir.path().join("goal.json");
    std::fs::write(&goal_path, goal.to_string()).expect("goal");

    let _w = WorkerProcess::start(on_openai_at(&model.openai_base()), &s, "memory");
    let out = run_temporal_as(
        on_openai_at(&model.openai_base()),
        &s,
        "memory",
        &goal_path,
        &["--model", "openai:a"],
    );
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let requests = model.requests();
    assert_each_step_recalls_what_the_step_before_brought(&requests);
    let second = memory_text(&requests[1].body);
    assert!(!second.contains("shipment-"), "{second}");
    // The searches are in the history: it replays without the folder.
    std::fs::remove_dir_all(&notes).expect("remove notes");
    let id = run_id(&out);
    let history = conn.history_json(&id).await.expect("history");
    assert!(
        String::from_utf8_lossy(&history).contains("memory_search"),
        "no memory search activity in the history"
    );
    replays(&conn, &id).await;
}

/// A worker whose grants do not cover the run's memory folder cannot search it: step 1's
/// journaled `recalled` entry has no chunks and a note naming the grant refusal, and the run
/// fails with that refusal (the worker refuses the goal's model turn too), the model unasked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_not_granted_the_memory_folder_says_so_in_the_journal() {
    use model_runs::{TINY, answer, final_output};
    let Some(s) = server() else { return };
    let conn = s.connect().await;
    let greet = json!({"calls": [{"_tool": "greet", "name": "Ada",
        "_output": {"greeting": "Hello Ada"}, "_outputPath": "†state.greeting"}], "output": null});
    let model = common::serve(vec![answer(greet), answer(final_output())]).await;
    let dir = tempfile::tempdir().expect("dir");
    let notes = dir.path().join("notes");
    std::fs::create_dir_all(&notes).expect("notes");
    std::fs::write(
        notes.join("ada-greeting.md"),
        "# Greeting Ada\n\nAda likes a greeting that calls her Countess Lovelace.\n",
    )
    .expect("note");
    let mut goal: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(TINY)).expect("tiny"),
    )
    .expect("goal");
    goal["memory"] = json!({"path": "notes"});
    let goal_path = dir.path().join("goal.json");
    std::fs::write(&goal_path, goal.to_string()).expect("goal");
    let granted = dir.path().join("elsewhere");
    std::fs::create_dir_all(&granted).expect("elsewhere");
    let config = dir.path().join("worker.json");
    std::fs::write(
        &config,
        json!({"grants": {"files": [granted.display().to_string()]}}).to_string(),
    )
    .expect("config");
    let child = on_openai_at(&model.openai_base())
        .arg("--config")
        .arg(&config)
        .args([
            "worker",
            "--temporal",
            &s.address,
            "--task-queue",
            "ungranted",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("dagloop worker");
    let _w = WorkerProcess(child);
    let out = run_temporal_as(
        on_openai_at(&model.openai_base()),
        &s,
        "ungranted",
        &goal_path,
        &["--model", "openai:a"],
    );
    // The worker refuses the run's goal as a whole (as `dagloop run` would, rule C3): the
    // model is never asked and the run fails naming the grant.
    assert!(!out.status.success());
    assert!(model.requests().is_empty());
    let snapshot = conn.snapshot(&run_id(&out)).await.expect("snapshot");
    let journal = serde_json::to_value(&snapshot.journal).expect("json");
    let entries = journal.as_array().cloned().unwrap_or_default();
    let recalled = entries
        .iter()
        .find(|e| e["input"] == "recalled")
        .expect("step 1 recalled");
    assert_eq!(recalled["step"], 1);
    assert!(recalled.get("chunks").is_none(), "{recalled}");
    let note = recalled["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("the worker could not search the memory folder")
            && note.contains("/memory/path"),
        "{note}"
    );
    let closed = entries
        .iter()
        .find(|e| e["input"] == "stream_closed")
        .expect("the turn ended");
    assert!(
        closed["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("/memory/path")),
        "{closed}"
    );
}

/// Histories recorded by the version before timers moved into the machine (it armed one
/// workflow timer per timer setting, before the turn's activity) still replay through this
/// build (spec/timers.md TM4): a run deadline set at the start with a reviewer's timeout that
/// fired and approved by default, and a run deadline that fired while a call ran. (This build's
/// own timer, one for the machine's next deadline, is armed after the turn's activity: these
/// histories replay only because the workflow takes the old path for them.) Needs no server: the replayer runs the workflow's code against the recorded events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histories_recorded_before_timers_moved_into_the_machine_still_replay() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/temporal");
    for name in ["approval_timeout", "run_deadline"] {
        let history = std::fs::read(dir.join(format!("{name}.history.json"))).expect("fixture");
        let v: Value = serde_json::from_slice(&history).expect("history JSON");
        let kinds: Vec<u64> = v["events"]
            .as_array()
            .expect("events")
            .iter()
            .filter_map(|e| e["event_type"].as_u64())
            .collect();
        // As recorded: a timer started (17) before the first activity was scheduled (10).
        let first = |k: u64| kinds.iter().position(|x| *x == k).expect("event kind");
        assert!(first(17) < first(10), "{name}: {kinds:?}");
        dagloop::temporal::replay(&history)
            .await
            .unwrap_or_else(|e| panic!("{name}, recorded before the patch, does not replay: {e}"));
    }
}

/// [`step_goal`] (no approval) with `extra` merged into the goal.
fn step_goal_with(dir: &Path, url: &str, calls: Value, extra: Value) -> PathBuf {
    let path = step_goal(dir, url, None, calls);
    let mut g: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("goal")).expect("goal JSON");
    if let (Some(g), Some(e)) = (g.as_object_mut(), extra.as_object()) {
        g.extend(e.clone());
    }
    std::fs::write(&path, g.to_string()).expect("goal");
    path
}

/// The kinds of a history's events, in order (`timerStartedEventAttributes`, ...).
fn kinds(history: &[u8]) -> Vec<String> {
    let v: Value = serde_json::from_slice(history).expect("history JSON");
    history_events(&v).into_iter().map(|e| e.1).collect()
}

/// Timers on Temporal are the machine's (spec/timers.md TM4): the workflow arms one workflow
/// timer for the machine's next deadline after it performed the actions (so, unlike a history
/// recorded before the patch, after the first model turn's activity), and when it ends the
/// machine's timers due by then fire. A reviewer's timeout, started by a showing sent by
/// update, approves by default and the call runs; a run's deadline ends a run whose call is
/// still running, as `timeout`. Both histories replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_on_temporal_fire_at_the_machines_next_deadline() {
    let Some(s) = server() else { return };
    let conn = s.connect().await;
    let dir = tempfile::tempdir().expect("dir");
    let (url, seen) = counting_service(4000).await;
    let _w = WorkerProcess::start(bin::dagloop(), &s, "timers");
    let started_after_the_turn = |h: &[u8]| {
        let k = kinds(h);
        let first = |name: &str| k.iter().position(|x| x == name);
        let timer = first("timerStartedEventAttributes").expect("a timer started");
        let activity = first("activityTaskScheduledEventAttributes").expect("an activity");
        assert!(activity < timer, "{k:?}");
        k.iter()
            .filter(|x| *x == "timerStartedEventAttributes")
            .count()
    };

    let calls = json!([{"_tool": "step", "n": 2, "_outputPath": "†state.a"}]);
    let extra = json!({"limits": {"timeout_s": 600},
        "approval": {"policy": "ask", "timeout_s": 1, "default_decision": "approve"}});
    let goal = step_goal_with(dir.path(), &url, calls, extra);
    let out = run_temporal(&s, "timers", &goal, &["--detach"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = run_id(&out);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let presentation = loop {
        let page = conn.events(&id, 0).await.expect("events");
        let asked = page.events.iter().find(|e| {
            matches!(
                e.kind,
                dagloop::protocol::EventKind::ApprovalRequested { .. }
            )
        });
        if let Some(e) = asked {
            break e.seq;
        }
        assert!(std::time::Instant::now() < deadline, "never asked");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let shown = dagloop::protocol::Op::Shown {
        call: dagloop::protocol::CallId(1),
        presentation,
    };
    conn.decide(&id, shown).await.expect("shown");
    let r = tokio::time::timeout(Duration::from_secs(60), conn.result(&id))
        .await
        .expect("ended")
        .expect("result");
    assert!(r.succeeded(), "{r:?}");
    assert_eq!(r.calls[0].decision.as_deref(), Some("approve"), "{r:?}");
    assert_eq!(seen.lock().expect("seen")[&2].len(), 1);
    let history = conn.history_json(&id).await.expect("history");
    // The run's deadline, then the reviewer's (earlier): two timers, none per clearing.
    assert_eq!(started_after_the_turn(&history), 2);
    replays(&conn, &id).await;

    let calls = json!([{"_tool": "step", "n": 1, "_outputPath": "†state.a"}]);
    let goal = step_goal_with(dir.path(), &url, calls, json!({"limits": {"timeout_s": 1}}));
    let out = run_temporal(&s, "timers", &goal, &["--detach"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = run_id(&out);
    let r = tokio::time::timeout(Duration::from_secs(60), conn.result(&id))
        .await
        .expect("ended")
        .expect("result");
    assert_eq!(r.status.as_str(), "timeout", "{r:?}");
    let history = conn.history_json(&id).await.expect("history");
    assert_eq!(started_after_the_turn(&history), 1);
    assert!(kinds(&history).contains(&"timerFiredEventAttributes".to_string()));
    replays(&conn, &id).await;
}

/// The seq of each `approval_requested` of run `id` by call, once `n` calls were asked.
async fn asked(conn: &Connection, id: &str, n: usize) -> BTreeMap<u64, u64> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let page = conn.events(id, 0).await.expect("events");
        let asked: BTreeMap<u64, u64> = page
            .events
            .iter()
            .filter(|e| {
                matches!(
                    e.kind,
                    dagloop::protocol::EventKind::ApprovalRequested { .. }
                )
            })
            .filter_map(|e| Some((e.call?.0, e.seq)))
            .collect();
        if asked.len() >= n {
            return asked;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never asked: {asked:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A reviewer's timeout cleared before it fires, and the next deadline moved later, on the
/// new path (spec/temporal_versions.md TV1, TV2). Two calls ask a reviewer (`timeout_s: 2`,
/// `default_decision: reject`): call 1 is shown and approved at once, which clears its timeout
/// before it is due; call 2 is shown a second later, so the machine's next deadline moves
/// later and the workflow arms a second timer for it. Call 1 takes 4 s, so the run goes on past
/// both deadlines: the first workflow timer ends and changes nothing (call 1 keeps the
/// reviewer's approval, not the default), the second times call 2 out (the default, reject).
/// The history replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reviewer_timeout_cleared_or_moved_later_on_temporal() {
    use dagloop::protocol::{CallId, Decision, Op};
    let Some(s) = server() else { return };
    let conn = s.connect().await;
    let dir = tempfile::tempdir().expect("dir");
    let (url, seen) = counting_service(4000).await;
    let _w = WorkerProcess::start(bin::dagloop(), &s, "cleared");
    let calls = json!([
        {"_tool": "step", "n": 2, "_outputPath": "†state.b"},
        {"_tool": "step", "n": 1, "_outputPath": "†state.a"}
    ]);
    let extra =
        json!({"approval": {"policy": "ask", "timeout_s": 2, "default_decision": "reject"}});
    let goal = step_goal_with(dir.path(), &url, calls, extra);
    let out = run_temporal(&s, "cleared", &goal, &["--detach"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = run_id(&out);
    let asked = asked(&conn, &id, 2).await;
    let shown = |call: u64| Op::Shown {
        call: CallId(call),
        presentation: asked[&call],
    };
    // Call 2 (n: 1, the slow one) is shown and approved at once: its timeout is cleared.
    conn.decide(&id, shown(2)).await.expect("shown");
    let approve = Op::Decide {
        call: CallId(2),
        decision: Decision::Approve,
        presented: None,
        presentation: Some(asked[&2]),
        by: None,
    };
    conn.decide(&id, approve).await.expect("approved");
    // Call 1 is shown a second later: a later deadline than the one armed.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    conn.decide(&id, shown(1)).await.expect("shown");
    let r = tokio::time::timeout(Duration::from_secs(60), conn.result(&id))
        .await
        .expect("ended")
        .expect("result");
    let decision = |call: u64| {
        r.calls
            .iter()
            .find(|c| c.id.0 == call)
            .and_then(|c| c.decision.clone())
    };
    assert!(r.succeeded(), "{r:?}");
    assert_eq!(decision(2).as_deref(), Some("approve"), "{r:?}");
    assert_eq!(decision(1).as_deref(), Some("reject"), "{r:?}");
    assert_eq!(seen.lock().expect("seen")[&1].len(), 1);
    assert!(!seen.lock().expect("seen").contains_key(&2));
    let history = conn.history_json(&id).await.expect("history");
    let k = kinds(&history);
    let count = |name: &str| k.iter().filter(|x| *x == name).count();
    // One workflow timer per deadline armed: the first shown's, then the later one.
    assert_eq!(count("timerStartedEventAttributes"), 2, "{k:?}");
    assert_eq!(count("timerFiredEventAttributes"), 2, "{k:?}");
    replays(&conn, &id).await;
}
