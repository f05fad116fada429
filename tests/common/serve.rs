//! `dagloop serve` as the server tests drive it: the real binary on a free loopback port, a
//! reqwest client, a counting tool service, a two-call goal, and helpers to poll a run, read
//! its SSE events and check coded refusals.
//!
//! Every answer [`send`] and [`read_events`] receive is checked against the committed OpenAPI
//! document ([`contract`]).
//!
//! Included with `#[path = "common/serve.rs"] mod serve;` next to `#[path = "common/bin.rs"] mod
//! bin;` (it starts the binary through `bin`).
#![allow(dead_code)]

#[path = "contract.rs"]
pub mod contract;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{Value, json};

use super::bin;

pub type Counts = Arc<Mutex<BTreeMap<u64, u64>>>;

/// A service that counts how many times each `n` was executed and echoes what it got.
pub async fn counting_service() -> (String, Counts) {
    service(None).await
}

/// [`counting_service`], except that an execution with `n == hold` never answers: the call stays
/// in flight until the process that made it dies.
pub async fn holding_service(hold: u64) -> (String, Counts) {
    service(Some(hold)).await
}

async fn service(hold: Option<u64>) -> (String, Counts) {
    let counts: Counts = Arc::default();
    let app = axum::Router::new()
        .route(
            "/step",
            post(
                move |State(c): State<Counts>, Json(body): Json<Value>| async move {
                    let n = body["n"].as_u64().unwrap_or(0);
                    *c.lock().expect("counts").entry(n).or_default() += 1;
                    if hold == Some(n) {
                        std::future::pending::<()>().await;
                    }
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

/// How many times the service executed `n`.
pub fn count(counts: &Counts, n: u64) -> u64 {
    counts.lock().expect("counts").get(&n).copied().unwrap_or(0)
}

/// The presentation the journaled decision about call `call` of a stored run named, and the
/// one the call awaited a decision on just before that decision (what its reviewer saw).
pub fn decided_presentation(store: &Path, run: &str, call: u64) -> (Option<u64>, Option<u64>) {
    use dagloop::store::{RunStore, SqliteStore};
    let stored = SqliteStore::open(store)
        .and_then(|s| s.load(run))
        .expect("load");
    let at = stored
        .journal
        .iter()
        .position(|e| matches!(&e.input, dagloop::RunInput::Decided { call: c, .. } if c.0 == call))
        .expect("a decision about the call");
    let named = match &stored.journal[at].input {
        dagloop::RunInput::Decided { presentation, .. } => *presentation,
        _ => None,
    };
    let before = dagloop::runs::rebuild(&stored.record, &stored.journal[..at]).expect("rebuild");
    (named, before.machine.presentation(dagloop::CallId(call)))
}

/// A goal with two independent http calls and a final output that reads both; `policy` is the
/// approval policy. The scripted model file is written beside it.
pub fn goal(dir: &Path, url: &str, policy: &str) -> Value {
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
pub struct Server {
    pub child: Child,
    pub base: String,
    pub resumed: Vec<String>,
}

impl Server {
    pub fn start(store: &Path, token: Option<&str>) -> Server {
        Server::start_with(store, token, |_| {})
    }

    /// [`Server::start`], with `setup` changing the command last (working directory, env,
    /// more `serve` arguments).
    pub fn start_with(
        store: &Path,
        token: Option<&str>,
        setup: impl FnOnce(&mut Command),
    ) -> Server {
        Server::start_config(store, &bin::open_config(), token, setup)
    }

    /// [`Server::start_with`] under this operator config instead of the tests' open one.
    pub fn start_config(
        store: &Path,
        config: &Path,
        token: Option<&str>,
        setup: impl FnOnce(&mut Command),
    ) -> Server {
        let mut c = bin::dagloop();
        c.arg("--config")
            .arg(config)
            .args(["serve", "--addr", "127.0.0.1:0", "--store"])
            .arg(store)
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        match token {
            Some(t) => c.env("DAGLOOP_TOKEN", t),
            None => c.env_remove("DAGLOOP_TOKEN"),
        };
        setup(&mut c);
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

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn client() -> reqwest::Client {
    dagloop::net::client().expect("an HTTP client")
}

/// Sends a request and reads its answer as JSON (a string when it is not JSON), checked
/// against the schema the OpenAPI document declares for its route and status.
pub async fn send(rb: reqwest::RequestBuilder) -> (u16, Value) {
    let (c, req) = rb.build_split();
    let req = req.expect("a request");
    let (method, path) = (req.method().to_string(), req.url().path().to_string());
    let r = c.execute(req).await.expect("request");
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let text = r.text().await.expect("body");
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    contract::check(&method, &path, status, &ct, &body);
    (status, body)
}

pub async fn create(s: &Server, body: &Value) -> String {
    let (status, v) = send(client().post(s.url("/runs")).json(body)).await;
    assert_eq!(status, 201, "{v}");
    v["id"].as_str().expect("id").to_string()
}

/// Polls the run until `pred` holds (bounded).
pub async fn until(s: &Server, id: &str, pred: impl Fn(&Value) -> bool) -> Value {
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
pub fn refused(got: (u16, Value), status: u16, code: &str) {
    assert_eq!(
        (got.0, got.1["code"].as_str()),
        (status, Some(code)),
        "{}",
        got.1
    );
}

/// Approves call `call` of run `id` through the API (asserting it applied).
pub async fn approve(s: &Server, id: &str, call: u64) {
    let (status, v) = send(
        client()
            .post(s.url(&format!("/runs/{id}/approvals/{call}")))
            .json(&json!({"decision": "approve"})),
    )
    .await;
    assert_eq!(status, 200, "{v}");
}

pub fn awaiting(v: &Value) -> Vec<Value> {
    v["awaiting"].as_array().cloned().unwrap_or_default()
}

/// Reads SSE events (id, type) until `run_finished` or `limit` events (or, with `limit` 0,
/// until none came for a second: what the run has published so far).
pub async fn read_events(
    url: &str,
    last: Option<u64>,
    limit: usize,
    token: Option<&str>,
) -> Vec<(u64, String)> {
    let path = reqwest::Url::parse(url).expect("url").path().to_string();
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
        contract::check_event(&path, &data);
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

/// Reads a run's SSE events (their JSON, each checked against the document) from the start
/// until `done` holds for the events read so far; fails when the stream ends first or no event
/// comes for 10 s.
pub async fn events_until(
    url: &str,
    token: Option<&str>,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let path = reqwest::Url::parse(url).expect("url").path().to_string();
    let mut rb = client().get(url);
    if let Some(t) = token {
        rb = rb.bearer_auth(t);
    }
    let r = rb.send().await.expect("events");
    assert_eq!(r.status().as_u16(), 200);
    let mut stream = r.bytes_stream().eventsource();
    let mut out: Vec<Value> = Vec::new();
    while !done(&out) {
        let ev = match tokio::time::timeout(Duration::from_secs(10), stream.next()).await {
            Ok(Some(Ok(ev))) => ev,
            Ok(Some(Err(e))) => panic!("the event stream broke: {e}"),
            Ok(None) => panic!("the event stream ended first: {out:?}"),
            Err(_) => panic!("no event within 10 s: {out:?}"),
        };
        let data: Value = serde_json::from_str(&ev.data).expect("event JSON");
        contract::check_event(&path, &data);
        out.push(data);
    }
    out
}

/// What a recording service was sent: one line per request, its path and query, then each
/// header as `name: value`.
pub type Seen = Arc<Mutex<Vec<String>>>;

/// A loopback service that records every request; `/redirect?to=URL` answers with a redirect.
pub async fn recording_service() -> (u16, Seen) {
    let seen: Seen = Arc::default();
    let s = seen.clone();
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let s = s.clone();
        async move {
            let mut line = req.uri().to_string();
            for (k, v) in req.headers() {
                line.push_str(&format!("\n{k}: {}", v.to_str().unwrap_or("")));
            }
            s.lock().expect("seen").push(line);
            let to = req
                .uri()
                .query()
                .and_then(|q| q.strip_prefix("to="))
                .map(str::to_string);
            match to {
                Some(to) if req.uri().path() == "/redirect" => {
                    axum::response::IntoResponse::into_response(
                        axum::response::Redirect::temporary(&to),
                    )
                }
                _ => axum::response::IntoResponse::into_response(axum::Json(json!({"ok": true}))),
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, seen)
}

/// An `http` tool without params.
pub fn get_tool(name: &str, url: &str, headers: Value) -> Value {
    json!({"_tool": name, "_activity": "http",
        "_http": {"method": "GET", "url": url, "headers": headers},
        "type": "object", "properties": {}})
}

/// A scripted model that calls `tools` once each, then answers `{"done": true}`.
pub fn script_calling(dir: &Path, tools: &[&str]) -> String {
    let calls: Vec<Value> = tools.iter().map(|t| json!({"_tool": t})).collect();
    let path = dir.join("s.json");
    let s = json!({"turns": [
        {"solution": {"calls": calls, "output": null}},
        {"solution": {"calls": [], "output": {"done": true}}}
    ]});
    std::fs::write(&path, s.to_string()).expect("script");
    format!("scripted:{}", path.display())
}

/// `dagloop serve` under the operator config `toml` (written into `dir`, its file root), with
/// the environment `env`.
pub fn serve_with(dir: &Path, toml: &str, env: &[(&str, &str)]) -> Server {
    let cfg = dir.join("dagloop.toml");
    std::fs::write(&cfg, toml).expect("config");
    Server::start_config(&dir.join("runs.db"), &cfg, None, |c| {
        c.current_dir(dir);
        for (k, v) in env {
            c.env(k, v);
        }
    })
}

/// Submits `goal` and returns the run once it finished.
pub async fn run_to_end(s: &Server, goal: &Value) -> Value {
    let (status, v) = send(client().post(s.url("/runs")).json(goal)).await;
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().expect("id").to_string();
    until(s, &id, |v| {
        !matches!(v["status"].as_str(), Some("running" | "stopped"))
    })
    .await
}

/// The call of `tool` in a run's view.
pub fn call_of<'a>(run: &'a Value, tool: &str) -> &'a Value {
    run["calls"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["tool"] == tool))
        .unwrap_or_else(|| panic!("no call of {tool}: {run}"))
}

/// Field `name` (e.g. `VmRSS:`, `Threads:`) of process `pid`'s `/proc/PID/status` now: its
/// first number (0 when unreadable).
pub fn proc_status(pid: u32, name: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|n| n.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Resident memory of process `pid` now, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    proc_status(pid, "VmRSS:")
}
