//! `dagloop serve` over real HTTP on 127.0.0.1, driven as a client would: auth (token, tickets,
//! loopback rule), goal checks with JSON pointers, unknown ids, decisions (applied, stale,
//! twice), SSE with `Last-Event-ID`, a server killed with SIGKILL mid-run and started again,
//! and the OpenAPI document (served, and committed as schemas/openapi.json).

#[path = "common/bin.rs"]
mod bin;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{Value, json};

type Counts = Arc<Mutex<BTreeMap<u64, u64>>>;

/// A service that counts how many times each `n` was executed and echoes what it got.
async fn counting_service() -> (String, Counts) {
    let counts: Counts = Arc::default();
    let app = axum::Router::new()
        .route(
            "/step",
            post(
                |State(c): State<Counts>, Json(body): Json<Value>| async move {
                    let n = body["n"].as_u64().unwrap_or(0);
                    *c.lock().expect("counts").entry(n).or_default() += 1;
                    Json(json!({"n": n, "v": n * 10, "got": body}))
                },
            ),
        )
        .with_state(counts.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/step", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, counts)
}

/// A goal with two independent http calls and a final output that reads both; `policy` is the
/// approval policy. The scripted model file is written beside it.
fn goal(dir: &Path, url: &str, policy: &str) -> Value {
    let step = json!({"_tool": "step", "_activity": "http", "_http": {"method": "POST", "url": url},
        "type": "object", "properties": {"n": {"type": "integer"}, "note": {"type": "string"}},
        "required": ["n"], "additionalProperties": false});
    let script = json!({"turns": [
        {"solution": {"calls": [
            {"_tool": "step", "n": 1, "note": "first", "_outputPath": "†state.a"},
            {"_tool": "step", "n": 2, "_outputPath": "†state.b"}
        ], "output": null}, "chunk_chars": 32, "chunk_delay_ms": 2},
        {"solution": {"calls": [], "output": {"a": "†state.a", "b": "†state.b.v"}}, "chunk_chars": 32, "chunk_delay_ms": 2}
    ]});
    let script_path = dir.join("s.json");
    std::fs::write(&script_path, script.to_string()).expect("script");
    json!({"goal": "two steps", "model": format!("scripted:{}", script_path.display()),
        "output_schema": {"type": "object", "required": ["a", "b"]},
        "tools": [step], "approval": {"policy": policy}})
}

/// A `dagloop serve` process on a free loopback port.
struct Server {
    child: Child,
    base: String,
    resumed: Vec<String>,
}

impl Server {
    fn start(store: &Path, token: Option<&str>) -> Server {
        Server::start_with(store, token, |_| {})
    }

    /// [`Server::start`], with `setup` changing the command first (working directory, env).
    fn start_with(store: &Path, token: Option<&str>, setup: impl FnOnce(&mut Command)) -> Server {
        let mut c = bin::dagloop();
        setup(&mut c);
        c.arg("--config")
            .arg(bin::open_config())
            .args(["serve", "--addr", "127.0.0.1:0", "--store"])
            .arg(store)
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        match token {
            Some(t) => c.env("DAGLOOP_TOKEN", t),
            None => c.env_remove("DAGLOOP_TOKEN"),
        };
        let mut child = c.spawn().expect("spawn dagloop serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read");
        let v: Value = serde_json::from_str(&line).expect("the first line is JSON");
        assert_eq!(v["status"], "listening", "{v}");
        let base = v["url"]
            .as_str()
            .expect("url")
            .trim_end_matches('/')
            .to_string();
        let resumed = v["resumed"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r.as_str().map(str::to_string))
            .collect();
        Server {
            child,
            base,
            resumed,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn kill(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

fn client() -> reqwest::Client {
    dagloop::net::client().expect("an HTTP client")
}

async fn send(rb: reqwest::RequestBuilder) -> (u16, Value) {
    let r = rb.send().await.expect("request");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn create(s: &Server, body: &Value) -> String {
    let (status, v) = send(client().post(s.url("/runs")).json(body)).await;
    assert_eq!(status, 201, "{v}");
    v["id"].as_str().expect("id").to_string()
}

/// Polls the run until `pred` holds (bounded).
async fn until(s: &Server, id: &str, pred: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..400 {
        let (status, v) = send(client().get(s.url(&format!("/runs/{id}")))).await;
        assert_eq!(status, 200, "{v}");
        if pred(&v) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let (_, v) = send(client().get(s.url(&format!("/runs/{id}")))).await;
    panic!("the run never reached the expected state: {v}");
}

/// Asserts a refusal: this status and code.
fn refused(got: (u16, Value), status: u16, code: &str) {
    assert_eq!(
        (got.0, got.1["code"].as_str()),
        (status, Some(code)),
        "{}",
        got.1
    );
}

fn awaiting(v: &Value) -> Vec<Value> {
    v["awaiting"].as_array().cloned().unwrap_or_default()
}

/// Reads SSE events (id, type) until `run_finished` or `limit` events (or, with `limit` 0,
/// until none came for a second: what the run has published so far).
async fn read_events(
    url: &str,
    last: Option<u64>,
    limit: usize,
    token: Option<&str>,
) -> Vec<(u64, String)> {
    let mut rb = client().get(url);
    if let Some(l) = last {
        rb = rb.header("Last-Event-ID", l.to_string());
    }
    if let Some(t) = token {
        rb = rb.bearer_auth(t);
    }
    let r = rb.send().await.expect("events");
    assert_eq!(r.status().as_u16(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap_or("")
            .starts_with("text/event-stream")
    );
    let mut stream = r.bytes_stream().eventsource();
    let mut out = Vec::new();
    let wait = Duration::from_secs(if limit == 0 { 1 } else { 10 });
    loop {
        let next = tokio::time::timeout(wait, stream.next()).await;
        let ev = match next {
            Ok(Some(Ok(ev))) => ev,
            Ok(Some(Err(e))) => panic!("the event stream broke: {e}"),
            Ok(None) => break,
            Err(_) if limit == 0 => break,
            Err(_) => panic!("no event within 10 s"),
        };
        let data: Value = serde_json::from_str(&ev.data).expect("event JSON");
        let seq: u64 = ev.id.parse().expect("numeric id");
        assert_eq!(
            data["seq"], seq,
            "the SSE id is the event's sequence number"
        );
        assert_eq!(data["type"], ev.event.as_str());
        out.push((seq, ev.event.clone()));
        if ev.event == "run_finished" || (limit != 0 && out.len() >= limit) {
            break;
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reviewer_decides_over_http_and_stale_or_repeated_decisions_are_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let (url, counts) = counting_service().await;
    let s = Server::start(&dir.path().join("runs.db"), None);
    let id = create(&s, &goal(dir.path(), &url, "ask")).await;
    let v = until(&s, &id, |v| awaiting(v).len() == 2).await;
    assert_eq!(v["status"], "waiting");
    let listed = send(client().get(s.url("/runs"))).await.1;
    assert_eq!(listed[0]["id"], id.as_str());
    assert_eq!(listed[0]["waiting"], 2);
    let (_, approvals) = send(client().get(s.url(&format!("/runs/{id}/approvals")))).await;
    let first = approvals
        .as_array()
        .and_then(|a| a.iter().find(|a| a["call_id"] == 1))
        .cloned()
        .expect("call 1 awaits");
    assert_eq!(first["call"]["n"], 1);
    assert_eq!(first["tool_schema"]["required"], json!(["n"]));
    let decide = |call: u64, body: Value| {
        client()
            .post(s.url(&format!("/runs/{id}/approvals/{call}")))
            .json(&body)
    };
    // A decision quoting params the reviewer did not see is stale.
    refused(
        send(decide(
            1,
            json!({"decision": "approve", "presented": "0000000000000000"}),
        ))
        .await,
        409,
        "op.stale",
    );
    // An edit that breaks the tool's schema cannot apply.
    refused(
        send(decide(
            1,
            json!({"decision": "edit", "params": {"n": "one"}}),
        ))
        .await,
        422,
        "op.invalid_decision",
    );
    refused(
        send(decide(1, json!({"decision": "maybe"}))).await,
        400,
        "op.bad_decision",
    );
    let (st, e) = send(decide(
        1,
        json!({"decision": "edit", "params": {"n": 1, "note": "edited"}, "presented": first["params_hash"]}),
    ))
    .await;
    assert_eq!((st, e["status"].as_str()), (200, Some("applied")), "{e}");
    // Somebody decided first.
    let (st, e) = send(decide(1, json!({"decision": "approve"}))).await;
    assert_eq!(st, 409, "{e}");
    assert!(
        ["op.already_decided", "op.not_awaiting"].contains(&e["code"].as_str().unwrap_or("")),
        "{e}"
    );
    refused(
        send(decide(99, json!({"decision": "approve"}))).await,
        404,
        "op.unknown_call",
    );
    let (st, _) = send(decide(2, json!({"decision": "approve"}))).await;
    assert_eq!(st, 200);
    let done = until(&s, &id, |v| v["status"] == "succeeded").await;
    assert_eq!(done["output"]["a"]["got"]["note"], "edited", "{done}");
    assert_eq!(done["output"]["b"], 20);
    let calls = done["calls"].as_array().expect("calls");
    assert!(calls.iter().all(|c| c["status"] == "done"), "{done}");
    assert_eq!(calls[0]["decision"], "edit");
    // The reviewer's waits and the calls set this run's duration, not the model's turns.
    let path: Vec<&str> = done["critical_path"]
        .as_array()
        .expect("path")
        .iter()
        .filter_map(|s| s["what"].as_str())
        .collect();
    assert!(
        path.contains(&"reviewer") && path.contains(&"call step"),
        "{path:?}"
    );
    assert!(
        first["tool_schema"].get("_http").is_none(),
        "tool configuration stays hidden"
    );
    assert_eq!(
        *counts.lock().expect("counts"),
        BTreeMap::from([(1, 1), (2, 1)])
    );
    refused(
        send(decide(2, json!({"decision": "approve"}))).await,
        409,
        "op.run_finished",
    );
    refused(
        send(client().post(s.url(&format!("/runs/{id}/cancel")))).await,
        409,
        "op.run_finished",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_goals_and_bodies_are_refused_with_pointers_and_codes() {
    let dir = tempfile::tempdir().expect("tmp");
    let s = Server::start(&dir.path().join("runs.db"), None);
    let post = |body: Value| client().post(s.url("/runs")).json(&body);
    // Every schema violation, each with its pointer.
    let (st, e) = send(post(json!({"goal": 5, "tools": [{"_tool": 7}]}))).await;
    refused((st, e.clone()), 400, "goal.invalid");
    let pointers: Vec<&str> = e["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .filter_map(|p| p["pointer"].as_str())
        .collect();
    assert!(pointers.contains(&"/goal"), "{e}");
    assert!(pointers.iter().any(|p| p.starts_with("/tools/0")), "{e}");
    assert!(
        pointers.contains(&""),
        "the missing output_schema is at the root: {e}"
    );
    // The envelope's own fields are checked too.
    let g = json!({"goal": "x", "output_schema": {"type": "object"}});
    let (st, e) = send(post(
        json!({"goal": g, "approve": "sometimes", "colour": 1}),
    ))
    .await;
    assert_eq!(st, 400, "{e}");
    let pointers: Vec<&str> = e["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .filter_map(|p| p["pointer"].as_str())
        .collect();
    assert_eq!(pointers, ["/approve", "/colour"], "{e}");
    // A schema inside the goal that is not a JSON Schema.
    let bad = json!({"goal": "x", "output_schema": {"type": "object"},
        "tools": [{"_tool": "t", "type": "object", "properties": {"a": {"type": "nonsense"}}}]});
    let (st, e) = send(post(bad)).await;
    assert_eq!(st, 400, "{e}");
    assert!(
        e["errors"][0]["pointer"]
            .as_str()
            .unwrap_or("")
            .starts_with("/tools"),
        "{e}"
    );
    // Not JSON; too large.
    refused(
        send(
            client()
                .post(s.url("/runs"))
                .header("content-type", "application/json")
                .body("{not json"),
        )
        .await,
        400,
        "http.bad_body",
    );
    let huge = json!({"goal": "x".repeat(2 << 20), "output_schema": {}});
    let (st, _) = send(post(huge)).await;
    assert_eq!(st, 413);
    // Unknown ids.
    refused(
        send(client().get(s.url("/runs/run-nope"))).await,
        404,
        "store.unknown_run",
    );
    refused(
        send(
            client()
                .post(s.url("/runs/run-nope/approvals/1"))
                .json(&json!({"decision": "approve"})),
        )
        .await,
        404,
        "store.unknown_run",
    );
    let (st, _) = send(client().get(s.url("/runs/run-nope/events"))).await;
    assert_eq!(st, 404);
    let (st, _) = send(client().get(s.url("/runs"))).await;
    assert_eq!(st, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_guards_the_api_and_tickets_open_the_event_stream() {
    let dir = tempfile::tempdir().expect("tmp");
    let (url, _) = counting_service().await;
    let s = Server::start(&dir.path().join("runs.db"), Some("s3cret"));
    refused(
        send(client().get(s.url("/runs"))).await,
        401,
        "auth.missing",
    );
    refused(
        send(client().get(s.url("/runs")).bearer_auth("wrong")).await,
        401,
        "auth.invalid",
    );
    let (st, _) = send(client().get(s.url("/openapi.json"))).await;
    assert_eq!(st, 401);
    // The page itself is public.
    let page = client().get(s.url("/")).send().await.expect("page");
    assert_eq!(page.status().as_u16(), 200);
    let (st, e) = send(
        client()
            .post(s.url("/runs"))
            .bearer_auth("s3cret")
            .json(&goal(dir.path(), &url, "auto")),
    )
    .await;
    assert_eq!(st, 201, "{e}");
    let id = e["id"].as_str().expect("id").to_string();
    let events = s.url(&format!("/runs/{id}/events"));
    refused(
        send(client().get(format!("{events}?ticket=forged"))).await,
        401,
        "auth.ticket",
    );
    let (_, t) = send(client().post(s.url("/tickets")).bearer_auth("s3cret")).await;
    let ticket = t["ticket"].as_str().expect("ticket");
    assert_eq!(ticket.len(), 32);
    // A ticket opens the event stream only.
    let (st, _) = send(client().get(format!("{}?ticket={ticket}", s.url("/runs")))).await;
    assert_eq!(st, 401);
    let got = read_events(&format!("{events}?ticket={ticket}"), None, 1000, None).await;
    assert_eq!(got.last().map(|e| e.1.as_str()), Some("run_finished"));
    let got = read_events(&events, None, 1000, Some("s3cret")).await;
    assert_eq!(got.last().map(|e| e.1.as_str()), Some("run_finished"));
}

#[test]
fn a_non_loopback_address_needs_a_token() {
    let out = bin::dagloop()
        .args(["serve", "--addr", "0.0.0.0:0", "--no-store"])
        .env_remove("DAGLOOP_TOKEN")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let dir = tempfile::tempdir().expect("tmp");
    let out = bin::dagloop()
        .args(["serve", "--addr", "0.0.0.0:0", "--store"])
        .arg(dir.path().join("runs.db"))
        .env_remove("DAGLOOP_TOKEN")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON error");
    assert_eq!(v["error"]["code"], "server.token_required", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_resume_after_last_event_id_without_gap_or_duplicate() {
    let dir = tempfile::tempdir().expect("tmp");
    let (url, _) = counting_service().await;
    let s = Server::start(&dir.path().join("runs.db"), None);
    let id = create(&s, &goal(dir.path(), &url, "ask")).await;
    let events = s.url(&format!("/runs/{id}/events"));
    until(&s, &id, |v| awaiting(v).len() == 2).await;
    // A client reads a few events, drops the connection, and comes back.
    let first = read_events(&events, None, 4, None).await;
    assert_eq!(first.len(), 4);
    for call in [1, 2] {
        let (st, _) = send(
            client()
                .post(s.url(&format!("/runs/{id}/approvals/{call}")))
                .json(&json!({"decision": "approve"})),
        )
        .await;
        assert_eq!(st, 200);
    }
    let rest = read_events(&events, Some(first[3].0), 1000, None).await;
    let seqs: Vec<u64> = first.iter().chain(&rest).map(|e| e.0).collect();
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "no gap, no duplicate");
    assert_eq!(rest.last().map(|e| e.1.as_str()), Some("run_finished"));
    // The whole stream again, from the journal, is the same.
    let all = read_events(&events, None, 1000, None).await;
    assert_eq!(all, first.into_iter().chain(rest).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_run_continues_the_run_after_a_restart() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("runs.db");
    let (url, counts) = counting_service().await;
    // A short lease, so that the server started again after the kill may take the run at
    // once, as it would once a crashed server's lease ran out.
    let mut s = Server::start_with(&store, None, |c| {
        c.env("DAGLOOP_LEASE_MS", "1000");
    });
    let id = create(&s, &goal(dir.path(), &url, "allowlist")).await;
    until(&s, &id, |v| awaiting(v).len() == 2).await;
    // One call runs and completes; the other still waits for its reviewer.
    let (st, _) = send(
        client()
            .post(s.url(&format!("/runs/{id}/approvals/1")))
            .json(&json!({"decision": "approve"})),
    )
    .await;
    assert_eq!(st, 200);
    let before = until(&s, &id, |v| {
        v["calls"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["status"] == "done"))
    })
    .await;
    assert_eq!(
        before["state"]["a"]["n"], 1,
        "state is shown while the run goes on: {before}"
    );
    let seen = read_events(&s.url(&format!("/runs/{id}/events")), None, 0, None)
        .await
        .len();
    assert!(seen > 0);
    s.kill();
    std::thread::sleep(Duration::from_millis(1100));
    let s = Server::start(&store, None);
    assert_eq!(s.resumed, vec![id.clone()], "the server continues its run");
    let v = until(&s, &id, |v| awaiting(v).len() == 1).await;
    assert_eq!(awaiting(&v)[0]["call_id"], 2, "{v}");
    // The event stream picks up where the client was.
    let events = s.url(&format!("/runs/{id}/events"));
    let (st, _) = send(
        client()
            .post(s.url(&format!("/runs/{id}/approvals/2")))
            .json(&json!({"decision": "approve"})),
    )
    .await;
    assert_eq!(st, 200);
    let rest = read_events(&events, Some(seen as u64), 1000, None).await;
    assert_eq!(rest.first().map(|e| e.0), Some(seen as u64 + 1), "{rest:?}");
    assert_eq!(rest.last().map(|e| e.1.as_str()), Some("run_finished"));
    let done = until(&s, &id, |v| v["status"] == "succeeded").await;
    assert_eq!(done["output"]["b"], 20, "{done}");
    assert_eq!(before["id"], done["id"]);
    assert_eq!(
        *counts.lock().expect("counts"),
        BTreeMap::from([(1, 1), (2, 1)]),
        "no completed call ran twice"
    );
}

/// `dagloop serve` shares a goal's MCP servers between its runs: two runs of the mcp-files
/// example start the filesystem server once (a wrapper script logs every start), both succeed,
/// and the second one reads what it wrote through the same server.
#[cfg(feature = "mcp")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_starts_each_mcp_server_once_for_all_its_runs() {
    if std::env::var("DAGLOOP_SKIP_MCP").as_deref() == Ok("1") {
        eprintln!("SKIPPED (DAGLOOP_SKIP_MCP=1)");
        return;
    }
    let npm = std::env::var_os("DAGLOOP_MCP_NPM")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/dagloop/npm")))
        .unwrap_or_default()
        .join("node_modules/.bin/mcp-server-filesystem");
    assert!(
        npm.exists(),
        "{} is missing: run scripts/setup-mcp.sh (or set DAGLOOP_SKIP_MCP=1)",
        npm.display()
    );
    let dir = tempfile::tempdir().expect("tmp");
    let files = dir.path().join("files");
    std::fs::create_dir(&files).expect("files dir");
    let starts = dir.path().join("starts.log");
    let wrapper = dir.path().join("fs-server.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho started >> '{}'\nexec '{}' \"$@\"\n",
            starts.display(),
            npm.display()
        ),
    )
    .expect("wrapper");
    let chmod = Command::new("chmod")
        .arg("755")
        .arg(&wrapper)
        .status()
        .expect("chmod");
    assert!(chmod.success());
    let example = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/mcp-files");
    let mut goal: Value = serde_json::from_str(
        &std::fs::read_to_string(example.join("goal.json")).expect("example goal"),
    )
    .expect("JSON");
    goal["mcp_servers"][0]["command"] = json!(wrapper.display().to_string());
    goal["mcp_servers"][0]["args"] = json!([files.display().to_string()]);
    goal["mcp_servers"][0]["from_env"] = json!([]);
    let s = Server::start_with(&dir.path().join("runs.db"), None, |c| {
        c.current_dir(&example);
    });
    for round in 0..2 {
        let id = create(&s, &json!({"goal": goal})).await;
        let done = until(&s, &id, |v| {
            v["status"] != "running" && v["status"] != "waiting"
        })
        .await;
        assert_eq!(done["status"], "succeeded", "round {round}: {done}");
        assert_eq!(
            done["output"]["content"], "Buy oat milk. Call the plumber.",
            "{done}"
        );
    }
    let log = std::fs::read_to_string(&starts).expect("the wrapper ran");
    assert_eq!(log.lines().count(), 1, "one start for two runs: {log:?}");
}

/// `DAGLOOP_UPDATE_OPENAPI=1 cargo test --test server_api` rewrites schemas/openapi.json.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_is_served_and_matches_the_committed_one() {
    let dir = tempfile::tempdir().expect("tmp");
    let s = Server::start(&dir.path().join("runs.db"), None);
    let (st, served) = send(client().get(s.url("/openapi.json"))).await;
    assert_eq!(st, 200);
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("schemas/openapi.json");
    if std::env::var_os("DAGLOOP_UPDATE_OPENAPI").is_some() {
        let text = serde_json::to_string_pretty(&served).expect("json") + "\n";
        std::fs::write(&file, text).expect("write");
    }
    let committed: Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("schemas/openapi.json"))
            .expect("JSON");
    assert_eq!(
        served, committed,
        "the routes changed: run DAGLOOP_UPDATE_OPENAPI=1 cargo test --test server_api and commit schemas/openapi.json"
    );
    let paths = served["paths"].as_object().expect("paths");
    for p in [
        "/runs",
        "/runs/{id}",
        "/runs/{id}/events",
        "/runs/{id}/approvals",
        "/runs/{id}/approvals/{call}",
        "/runs/{id}/cancel",
        "/tickets",
    ] {
        assert!(paths.contains_key(p), "{p} is documented");
    }
}
