//! Services for the reviewer's-desk tests: a tool service whose `/gate` hangs on its first call
//! (so that a test can kill the process running it mid-call), and a webhook receiver on
//! loopback that refuses its first deliveries (so that retries show).
//!
//! Included with `#[path = "common/desk.rs"] mod desk;`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use serde_json::{Value, json};
use tokio::sync::Notify;

pub type Counts = Arc<Mutex<BTreeMap<u64, u64>>>;
/// Deliveries a receiver got, with when each came.
pub type Got = Arc<Mutex<Vec<(std::time::Instant, Value)>>>;

/// The tool service: `POST /step {"n"}` counts and answers `{"n", "v": n*10}`; `POST /gate`
/// hangs the first time (and signals `hit`), answers `{"open": true}` after.
pub struct Gated {
    pub base: String,
    pub counts: Counts,
    pub hit: Arc<Notify>,
}

#[derive(Clone)]
struct GateState {
    counts: Counts,
    hit: Arc<Notify>,
    gates: Arc<AtomicUsize>,
}

pub async fn gated_service() -> Gated {
    let st = GateState {
        counts: Arc::default(),
        hit: Arc::new(Notify::new()),
        gates: Arc::default(),
    };
    let app = axum::Router::new()
        .route(
            "/step",
            post(
                |State(s): State<GateState>, Json(b): Json<Value>| async move {
                    let n = b["n"].as_u64().unwrap_or(0);
                    *s.counts.lock().expect("counts").entry(n).or_default() += 1;
                    Json(json!({"n": n, "v": n * 10}))
                },
            ),
        )
        .route(
            "/gate",
            post(|State(s): State<GateState>| async move {
                if s.gates.fetch_add(1, Ordering::SeqCst) == 0 {
                    s.hit.notify_one();
                    std::future::pending::<()>().await;
                }
                Json(json!({"open": true}))
            }),
        )
        .with_state(st.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    Gated {
        base,
        counts: st.counts,
        hit: st.hit,
    }
}

/// Waits (bounded, generously) until the gate was hit.
pub async fn gate_hit(g: &Gated) {
    tokio::time::timeout(Duration::from_secs(120), g.hit.notified())
        .await
        .expect("the gate was never called");
}

/// A webhook receiver: answers 500 to its first `refuse` deliveries, then 200; keeps every
/// body it was sent (refused ones included) with the time it came.
pub struct Receiver {
    pub url: String,
    pub got: Got,
}

pub async fn receiver(refuse: usize) -> Receiver {
    let got: Got = Arc::default();
    let seen = Arc::new(AtomicUsize::new(0));
    let app =
        axum::Router::new()
            .route(
                "/hook",
                post(
                    move |State((got, seen)): State<(Got, Arc<AtomicUsize>)>,
                          Json(b): Json<Value>| async move {
                        got.lock()
                            .expect("got")
                            .push((std::time::Instant::now(), b));
                        if seen.fetch_add(1, Ordering::SeqCst) < refuse {
                            StatusCode::INTERNAL_SERVER_ERROR
                        } else {
                            StatusCode::OK
                        }
                    },
                ),
            )
            .with_state((got.clone(), seen));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    Receiver { url, got }
}

/// An http tool posting to `url`, with params `n` (integer) and `after` (anything).
pub fn http_tool(name: &str, url: &str, idempotent: bool) -> Value {
    let mut t = json!({"_tool": name, "_activity": "http", "_http": {"method": "POST", "url": url},
        "type": "object", "properties": {"n": {"type": "integer"}, "after": {}}});
    if idempotent {
        t["_idempotent"] = json!(true);
    }
    t
}

/// Writes `v` as `dir/name`; returns the path.
pub fn write(dir: &std::path::Path, name: &str, v: &Value) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, v.to_string()).expect("write");
    p
}

/// One scripted model turn: these calls, then this output.
pub fn turn(calls: Value, output: Value) -> Value {
    json!({"solution": {"calls": calls, "output": output}, "chunk_chars": 40, "chunk_delay_ms": 1})
}

/// The run id the binary prints on stderr with `--json`.
pub fn run_id(stderr: &[u8]) -> String {
    String::from_utf8_lossy(stderr)
        .lines()
        .find_map(|l| {
            serde_json::from_str::<Value>(l).ok()?["run_id"]
                .as_str()
                .map(String::from)
        })
        .expect("the run id on stderr")
}

/// A goal (policy `ask`, one http tool `step` posting to `url`) whose first turn writes a
/// chain 1 → 2 → 3 (each reads the one before) and an independent call 4 (`n: 9`); its second
/// turn adds call 5 (`n: 4`) reading 3; its output is `{"d": 40}`.
pub fn chain_goal(dir: &std::path::Path, url: &str) -> Value {
    let script = json!({"turns": [
        turn(json!([
            {"_tool": "step", "n": 1, "_outputPath": "†state.a"},
            {"_tool": "step", "n": 2, "after": "†state.a.v", "_outputPath": "†state.b"},
            {"_tool": "step", "n": 3, "after": "†state.b.v", "_outputPath": "†state.c"},
            {"_tool": "step", "n": 9, "_outputPath": "†state.z"}
        ]), Value::Null),
        turn(json!([{"_tool": "step", "n": 4, "after": "†state.c.v", "_outputPath": "†state.d"}]), Value::Null),
        turn(json!([]), json!({"d": "†state.d.v"}))
    ]});
    let s = write(dir, "s.json", &script);
    json!({"goal": "chain", "model": format!("scripted:{}", s.display()),
        "output_schema": {"type": "object", "required": ["d"]},
        "tools": [http_tool("step", url, false)], "approval": {"policy": "ask"}})
}

/// The call ids of a list of awaiting calls.
pub fn ids(list: &[Value]) -> Vec<u64> {
    list.iter().filter_map(|a| a["call_id"].as_u64()).collect()
}
