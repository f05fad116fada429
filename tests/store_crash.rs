//! Durable runs through the binary: a run killed (SIGKILL) after every possible number of
//! journal entries resumes, at once (the killed owner's lease is taken over without waiting for
//! it to expire), to the same output and state as an uninterrupted run, and no call whose
//! completion was recorded runs again; a run waiting for a reviewer is decided and resumed
//! from another process; bad stores and bad decisions get stable codes.

#[path = "common/bin.rs"]
mod bin;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};

type Counts = Arc<Mutex<BTreeMap<u64, u64>>>;
type Keys = Arc<Mutex<BTreeMap<u64, Vec<String>>>>;

/// A service that counts how many times each `n` was executed.
async fn counting_service() -> (String, Counts) {
    let (url, counts, _) = keyed_service().await;
    (url, counts)
}

/// The counting service, also recording each request's `Idempotency-Key` by `n`.
async fn keyed_service() -> (String, Counts, Keys) {
    let counts: Counts = Arc::default();
    let keys: Keys = Arc::default();
    let app = axum::Router::new()
        .route(
            "/step",
            post(
                |State((c, k)): State<(Counts, Keys)>,
                 headers: axum::http::HeaderMap,
                 Json(body): Json<Value>| async move {
                    tokio::time::sleep(Duration::from_millis(15)).await;
                    let n = body["n"].as_u64().unwrap_or(0);
                    let key = headers
                        .get("idempotency-key")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string();
                    k.lock().expect("keys").entry(n).or_default().push(key);
                    *c.lock().expect("counts").entry(n).or_default() += 1;
                    Json(json!({"n": n, "v": n * 10}))
                },
            ),
        )
        .with_state((counts.clone(), keys.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/step", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, counts, keys)
}

fn write_goal(dir: &Path, url: &str, approve: Option<&str>, idempotent: bool) -> PathBuf {
    let mut step = json!({"_tool": "step", "_activity": "http",
        "_http": {"method": "POST", "url": url},
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
    if idempotent {
        step["_idempotent"] = json!(true);
    }
    let mut goal = json!({"goal": "crash test", "model": "scripted:s.json",
        "output_schema": {"type": "object", "required": ["total"]}, "tools": [step]});
    if let Some(p) = approve {
        goal["approval"] = json!({"policy": p});
    }
    let calls = json!([
        {"_tool": "step", "n": 1, "_outputPath": "†state.a"},
        {"_tool": "step", "n": 2, "after": "†state.a", "_outputPath": "†state.b"},
        {"_tool": "step", "n": 3, "_outputPath": "†state.c"},
        {"_tool": "step", "n": 4, "after": "†state.b && †state.c", "_outputPath": "†state.d"}
    ]);
    let script = json!({"turns": [
        {"solution": {"calls": calls, "output": null}, "chunk_chars": 24, "chunk_delay_ms": 4},
        {"solution": {"calls": [], "output": {"total": "†state.d"}}, "chunk_chars": 24, "chunk_delay_ms": 4}
    ]});
    std::fs::write(dir.join("s.json"), script.to_string()).expect("script");
    let path = dir.join("goal.json");
    std::fs::write(&path, goal.to_string()).expect("goal");
    path
}

fn dagloop(store: &Path) -> Command {
    let mut c = bin::dagloop();
    c.env("DAGLOOP_STORE", store)
        .env_remove("DAGLOOP_CRASH_AFTER_ENTRIES");
    c
}

/// `dagloop run GOAL --json ARGS` with `store`, which must succeed.
fn run_ok(store: &Path, goal: &Path, args: &[&str]) -> std::process::Output {
    let out = dagloop(store)
        .args(["run"])
        .arg(goal)
        .arg("--json")
        .args(args)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `n` processes made by `command`, started together; their outputs once all have ended.
fn at_once(n: usize, command: impl Fn() -> Command) -> Vec<std::process::Output> {
    let children: Vec<_> = (0..n)
        .map(|_| {
            command()
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().expect("wait"))
        .collect()
}

/// Approves with `dagloop decide` whatever the stored run awaits, then `dagloop resume
/// --detach`, until the run no longer waits; its result.
fn approve_until_done(store: &Path, run: &str) -> Value {
    for _ in 0..10 {
        let shown = json_of(
            &dagloop(store)
                .args(["show", run, "--json"])
                .output()
                .expect("show"),
        );
        for a in shown["awaiting"].as_array().cloned().unwrap_or_default() {
            let out = dagloop(store)
                .args(["decide", run, &a["call_id"].to_string(), "approve"])
                .output()
                .expect("decide");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        let v = json_of(
            &dagloop(store)
                .args(["resume", run, "--json", "--detach"])
                .output()
                .expect("resume"),
        );
        if v["status"] != "waiting" {
            return v;
        }
    }
    panic!("run {run} never finished");
}

fn json_of(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn only_run(store: &Path) -> String {
    let out = dagloop(store)
        .args(["runs", "--json"])
        .output()
        .expect("runs");
    json_of(&out)[0]["id"].as_str().expect("a run").to_string()
}

/// The `n` of every call whose outcome the journal recorded (as the service answered it, so
/// an edited call counts under the `n` it ran with).
fn completed(store: &Path, run: &str) -> Vec<u64> {
    use dagloop::store::{RunStore, SqliteStore};
    let stored = SqliteStore::open(store)
        .and_then(|s| s.load(run))
        .expect("load");
    stored
        .journal
        .iter()
        .map(|e| serde_json::to_value(&e.input).expect("json"))
        .filter(|i| i["input"] == "outcome")
        .filter_map(|i| i["outcome"]["result"]["Ok"]["n"].as_u64())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_killed_after_any_journal_entry_resumes_to_the_same_result() {
    let (url, counts, keys) = keyed_service().await;
    let dir = tempfile::tempdir().expect("dir");
    let goal = write_goal(dir.path(), &url, None, true);
    let base_store = dir.path().join("base.db");
    let base = json_of(&run_ok(&base_store, &goal, &[]));
    assert_eq!(base["output"], json!({"total": {"n": 4, "v": 40}}));
    let id = base["run_id"].as_str().expect("run id").to_string();
    let shown = json_of(
        &dagloop(&base_store)
            .args(["show", &id, "--json"])
            .output()
            .expect("show"),
    );
    let entries = shown["journal_entries"].as_u64().expect("entries");
    assert!(entries >= 10, "{shown}");
    let mut crashed = 0;
    for n in 1..entries {
        counts.lock().expect("counts").clear();
        keys.lock().expect("keys").clear();
        let store = dir.path().join(format!("crash-{n}.db"));
        let out = dagloop(&store)
            .env("DAGLOOP_CRASH_AFTER_ENTRIES", n.to_string())
            .args(["run"])
            .arg(&goal)
            .arg("--json")
            .output()
            .expect("run");
        if out.status.success() {
            continue; // a batch of entries went past n in one commit: nothing to crash at n
        }
        crashed += 1;
        let run = only_run(&store);
        let done_before = completed(&store, &run);
        // At once: the crashed process's lease (20 s) still runs, but its process is gone.
        let out = dagloop(&store)
            .args(["resume", &run, "--json", "--no-wait"])
            .output()
            .expect("resume");
        resumed_like(&out, &base, &counts, &done_before, &[1, 2, 3, 4], n);
    }
    assert!(
        crashed * 2 >= entries - 1,
        "most entry counts crashed the run: {crashed}/{}",
        entries - 1
    );
}

/// A run resumed after a crash at entry `n` ended like the uninterrupted `base`: same output
/// and state; no call whose completion was recorded before the crash (`done_before`, by the
/// `n` it ran with) ran again; every call of `ran` ran.
fn resumed_like(
    out: &std::process::Output,
    base: &Value,
    counts: &Counts,
    done_before: &[u64],
    ran: &[u64],
    n: u64,
) {
    assert!(
        out.status.success(),
        "resume after {n}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let resumed = json_of(out);
    assert_eq!(
        resumed["output"], base["output"],
        "after a crash at entry {n}"
    );
    assert_eq!(
        resumed["state"], base["state"],
        "after a crash at entry {n}"
    );
    let counts = counts.lock().expect("counts").clone();
    for k in done_before {
        assert_eq!(
            counts.get(k),
            Some(&1),
            "call n={k} completed before the crash at {n} and ran again: {counts:?}"
        );
    }
    for k in ran {
        assert!(
            counts.contains_key(k),
            "n={k} never ran (crash at {n}): {counts:?}"
        );
    }
}

/// The run id a `--json` run printed on stderr as soon as the run existed.
fn run_id_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .find_map(|l| {
            serde_json::from_str::<Value>(l).ok()?["run_id"]
                .as_str()
                .map(String::from)
        })
        .unwrap_or_else(|| panic!("no run id: {}", String::from_utf8_lossy(&out.stderr)))
}

/// Where a crash left a run that asks a reviewer, as its journal shows it.
#[derive(Debug, Default)]
struct Left {
    /// Calls received, not yet decided.
    waiting: Vec<u64>,
    /// Calls started (approved) whose outcome was not recorded.
    interrupted: Vec<u64>,
    /// A model turn had streamed something and had not closed.
    mid_stream: bool,
}

fn left_by_crash(store: &Path, run: &str) -> Left {
    use dagloop::store::{RunStore, SqliteStore};
    let s = SqliteStore::open(store).expect("store");
    let stored = s.load(run).expect("load");
    let rb = dagloop::runs::rebuild(&stored.record, &stored.journal).expect("rebuild");
    let shown = dagloop::runs::describe(run, &rb, stored.journal.len(), None, false);
    let ids = |key: &str, status: &str| -> Vec<u64> {
        shown[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| status.is_empty() || c["status"] == status)
            .filter_map(|c| c["id"].as_u64().or(c["call_id"].as_u64()))
            .collect()
    };
    let kinds: Vec<&str> = stored.journal.iter().map(|e| e.input.name()).collect();
    let last_closed = kinds.iter().rposition(|k| *k == "stream_closed");
    let streamed = |k: &&str| matches!(*k, "call" | "output" | "usage" | "unreadable");
    let mid_stream = match last_closed {
        Some(i) => kinds[i + 1..].iter().any(streamed),
        None => kinds.iter().any(streamed),
    };
    Left {
        waiting: ids("awaiting", ""),
        interrupted: ids("calls", "interrupted"),
        mid_stream,
    }
}

/// The same sweep for a run whose calls all ask a reviewer (decisions given up front with
/// `--decisions`, on the run and again on resume) and whose tool is not idempotent: kills land
/// while calls wait for a decision, mid-call and mid-stream. The resumed run ends like an
/// uninterrupted one, no call whose completion was recorded runs twice, and every call that
/// was cut off mid-call is presented to the reviewer again, flagged `interrupted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_waiting_for_approval_killed_after_any_journal_entry_resumes_to_the_same_result() {
    let (url, counts) = counting_service().await;
    let dir = tempfile::tempdir().expect("dir");
    let goal = write_goal(dir.path(), &url, None, false);
    let decisions = dir.path().join("decisions.json");
    // Every step is approved, except that call 3 runs with other params.
    std::fs::write(
        &decisions,
        json!({"decisions": [
            {"tool": "step", "decision": "approve"},
            {"call": 3, "decision": "edit", "params": {"n": 30}}
        ]})
        .to_string(),
    )
    .expect("decisions");
    let run = |store: &Path, crash: Option<u64>| {
        let mut c = dagloop(store);
        if let Some(n) = crash {
            c.env("DAGLOOP_CRASH_AFTER_ENTRIES", n.to_string());
        }
        c.args(["run"])
            .arg(&goal)
            .args(["--approve", "ask", "--json", "--decisions"])
            .arg(&decisions)
            .output()
            .expect("run")
    };
    let base_store = dir.path().join("base.db");
    let out = run(&base_store, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let base = json_of(&out);
    assert_eq!(base["output"], json!({"total": {"n": 4, "v": 40}}));
    assert_eq!(
        base["state"]["c"],
        json!({"n": 30, "v": 300}),
        "the edit held"
    );
    let entries = {
        use dagloop::store::{RunStore, SqliteStore};
        let s = SqliteStore::open(&base_store).expect("store");
        s.load(&run_id_of(&out)).expect("load").journal.len() as u64
    };
    assert!(entries >= 15, "{entries}");
    let (mut waiting, mut interrupted, mut mid_stream, mut crashed) = (0, 0, 0, 0);
    for n in 1..entries {
        counts.lock().expect("counts").clear();
        let store = dir.path().join(format!("ask-{n}.db"));
        let out = run(&store, Some(n));
        if out.status.success() {
            continue; // a batch went past n in one commit: nothing to crash at n
        }
        crashed += 1;
        let id = run_id_of(&out);
        let left = left_by_crash(&store, &id);
        waiting += usize::from(!left.waiting.is_empty());
        interrupted += usize::from(!left.interrupted.is_empty());
        mid_stream += usize::from(left.mid_stream);
        let done_before = completed(&store, &id);
        let events = dir.path().join(format!("ask-{n}.events"));
        // At once, as in the sweep above.
        let out = dagloop(&store)
            .args(["resume", &id, "--json", "--no-wait", "--decisions"])
            .arg(&decisions)
            .arg("--events")
            .arg(&events)
            .output()
            .expect("resume");
        resumed_like(&out, &base, &counts, &done_before, &[1, 2, 30, 4], n);
        let events: Vec<Value> = std::fs::read_to_string(&events)
            .expect("events")
            .lines()
            .map(|l| serde_json::from_str(l).expect("event"))
            .collect();
        for call in &left.interrupted {
            assert!(
                events.iter().any(|e| e["type"] == "approval_requested"
                    && e["call_id"] == json!(call)
                    && e["interrupted"] == json!(true)),
                "call {call} was cut off by the crash at {n} and was not presented again as interrupted"
            );
        }
        assert!(
            !events.iter().any(|e| e["interrupted"] == json!(true)
                && !left
                    .interrupted
                    .contains(&e["call_id"].as_u64().unwrap_or(0))),
            "only calls cut off mid-call are flagged interrupted (crash at {n})"
        );
    }
    assert!(
        crashed * 2 >= entries - 1,
        "most entry counts crashed the run: {crashed}/{}",
        entries - 1
    );
    assert!(
        waiting > 0,
        "no crash landed while a call waited for a decision"
    );
    assert!(interrupted > 0, "no crash landed mid-call");
    assert!(mid_stream > 0, "no crash landed mid-stream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_run_is_decided_from_another_process_then_resumed() {
    let (url, counts) = counting_service().await;
    let dir = tempfile::tempdir().expect("dir");
    let goal = write_goal(dir.path(), &url, Some("ask"), true);
    let store = dir.path().join("runs.db");
    let waiting = json_of(&run_ok(&store, &goal, &["--detach"]));
    assert_eq!(waiting["status"], "waiting", "{waiting}");
    let run = waiting["run_id"].as_str().expect("id").to_string();
    let listed = json_of(
        &dagloop(&store)
            .args(["runs", "--json"])
            .output()
            .expect("runs"),
    );
    assert_eq!(listed[0]["status"], "waiting");
    assert!(listed[0]["waiting_approvals"].as_u64() >= Some(1));
    // Nothing ran yet: every call waits for a reviewer.
    assert!(counts.lock().expect("counts").is_empty());
    let bad = dagloop(&store)
        .args(["decide", &run, "99", "approve"])
        .output()
        .expect("decide");
    assert_eq!(bad.status.code(), Some(1));
    assert_eq!(json_of(&bad)["error"]["code"], "op.unknown_call");
    let result = approve_until_done(&store, &run);
    assert_eq!(result["status"], "succeeded", "{result}");
    assert_eq!(result["output"], json!({"total": {"n": 4, "v": 40}}));
    let again = dagloop(&store)
        .args(["decide", &run, "1", "approve"])
        .output()
        .expect("decide");
    assert_eq!(json_of(&again)["error"]["code"], "op.run_finished");
    let counts = counts.lock().expect("counts").clone();
    assert!(counts.values().all(|c| *c == 1), "{counts:?}");
    let bad = dagloop(&store)
        .args(["runs", "prune", "--older-than", "soon"])
        .output()
        .expect("prune");
    assert_eq!(json_of(&bad)["error"]["code"], "cli.bad_duration");
    let kept = json_of(
        &dagloop(&store)
            .args(["runs", "prune", "--older-than", "1d"])
            .output()
            .expect("prune"),
    );
    assert_eq!(kept["runs"], 0, "a fresh run is kept");
    std::thread::sleep(Duration::from_millis(1100));
    let pruned = json_of(
        &dagloop(&store)
            .args(["runs", "prune", "--older-than", "1s"])
            .output()
            .expect("prune"),
    );
    assert_eq!(pruned["runs"], 1);
    let listed = json_of(
        &dagloop(&store)
            .args(["runs", "--json"])
            .output()
            .expect("runs"),
    );
    assert_eq!(listed, json!([]));
}

#[test]
fn bad_stores_are_refused_with_codes_and_left_untouched() {
    let dir = tempfile::tempdir().expect("dir");
    let code = |store: &Path, args: &[&str]| {
        let out = dagloop(store).args(args).output().expect("dagloop");
        assert_eq!(
            out.status.code(),
            Some(2),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        json_of(&out)["error"]["code"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let junk = dir.path().join("junk.db");
    std::fs::write(&junk, b"this is not a database at all, just some text").expect("write");
    assert_eq!(code(&junk, &["runs"]), "store.foreign");
    assert_eq!(
        std::fs::read(&junk).expect("read"),
        b"this is not a database at all, just some text"
    );
    let future = dir.path().join("future.db");
    {
        let c = rusqlite::Connection::open(&future).expect("open");
        c.execute_batch("PRAGMA user_version = 99; CREATE TABLE runs(x);")
            .expect("setup");
    }
    assert_eq!(code(&future, &["runs"]), "store.too_new");
    let foreign = dir.path().join("foreign.db");
    {
        let c = rusqlite::Connection::open(&foreign).expect("open");
        c.execute_batch("CREATE TABLE customers(id);")
            .expect("setup");
    }
    assert_eq!(code(&foreign, &["runs"]), "store.foreign");
    let good = dir.path().join("good.db");
    drop(dagloop::store::SqliteStore::open(&good).expect("a new store"));
    assert_eq!(code(&good, &["show", "run-nope"]), "store.unknown_run");
    // A store cut short mid-file is damaged, not silently empty.
    let out = bin::dagloop()
        .env("DAGLOOP_STORE", &good)
        .args(["runs", "--json"])
        .output()
        .expect("runs");
    assert!(out.status.success());
    let bytes = std::fs::read(&good).expect("read");
    let cut = dir.path().join("cut.db");
    std::fs::write(&cut, &bytes[..bytes.len().min(100)]).expect("write");
    let c = code(&cut, &["runs"]);
    assert!(c == "store.corrupt" || c == "store.foreign", "{c}");
}

/// 100 runs at once in one store from one process, and several processes writing the same
/// store: every journal entry lands, nothing reports `database is locked`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_runs_and_processes_share_one_store() {
    use dagloop::store::{RunRecord, RunStore, SqliteStore};
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("shared.db");
    let store = Arc::new(SqliteStore::open(&path).expect("store"));
    let goal = dagloop::Goal::from_json(
        &json!({"goal": "g", "output_schema": {"type": "object"},
            "tools": [{"_tool": "t", "_activity": "rust", "type": "object"}]})
        .to_string(),
        "g.json".as_ref(),
        ".".into(),
    )
    .expect("goal");
    let mut handles = Vec::new();
    for i in 0..100 {
        let calls: Vec<Value> = (0..5).map(|k| json!({"_tool": "t", "k": k})).collect();
        let script = dagloop::llm::Script::parse(
            &json!({"turns": [{"solution": {"calls": calls, "output": null}},
                              {"solution": {"calls": [], "output": {"i": i}}}]})
            .to_string(),
            "s",
        )
        .expect("script");
        let mut b =
            dagloop::AgentBuilder::new(dagloop::RunDef::from_goal(goal.clone()).expect("defined"))
                .model(Arc::new(dagloop::llm::ScriptedModel::new(script)))
                .journal(store.clone());
        b.registry_mut()
            .register_fn("t", |p: Value| async move { Ok::<_, String>(p) });
        let agent = b.build().expect("build");
        let rec = RunRecord {
            id: agent.run_id().to_string(),
            created_at: i,
            goal: json!({}),
            base_dir: ".".into(),
            options: json!({}),
        };
        store.create(&rec).expect("create");
        handles.push(agent.start());
    }
    for h in &handles {
        let r = h.wait().await;
        assert!(r.succeeded(), "{r:?}");
        store.finish(h.run_id(), &r).expect("finish");
        let stored = store.load(h.run_id()).expect("load");
        assert_eq!(
            stored.journal,
            h.journal(),
            "every entry of {} landed, in order",
            h.run_id()
        );
    }
    // Several processes at once on the same file.
    let (url, _counts) = counting_service().await;
    let goal = write_goal(dir.path(), &url, None, true);
    let outs = at_once(6, || {
        let mut c = bin::dagloop();
        c.env("DAGLOOP_STORE", &path)
            .args(["run"])
            .arg(&goal)
            .arg("--json");
        c
    });
    for out in outs {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(!stderr.contains("locked"), "{stderr}");
    }
    let listed = json_of(
        &dagloop(&path)
            // `runs` lists 50 by default (`--limit`, up to 500).
            .args(["runs", "--json", "--limit", "500"])
            .output()
            .expect("runs"),
    );
    assert_eq!(listed.as_array().map(Vec::len), Some(106));
    assert!(
        listed
            .as_array()
            .into_iter()
            .flatten()
            .all(|r| r["status"] == "succeeded")
    );
}

/// Writes `run` into a store at schema version 1 the way dagloop 1 did: a `runs` row and a
/// journal row per entry.
fn write_v1_run(db: &rusqlite::Connection, run: &dagloop::store::StoredRun) {
    let record = serde_json::to_string(&run.record).expect("record");
    let result = run
        .result
        .as_ref()
        .map(|r| serde_json::to_string(r).expect("result"));
    let status = run.result.as_ref().map_or("running", |r| r.status.as_str());
    db.execute(
        "INSERT INTO runs (id, created_at, updated_at, record, result, status, entries, owner_pid)
         VALUES (?1, ?2, ?2, ?3, ?4, ?5, ?6, NULL)",
        rusqlite::params![
            run.record.id,
            run.record.created_at as i64,
            record,
            result,
            status,
            run.journal.len() as i64
        ],
    )
    .expect("run row");
    for e in &run.journal {
        db.execute(
            "INSERT INTO journal (run_id, seq, at, input) VALUES (?1, ?2, ?3, ?4)",
            rusqlite::params![
                run.record.id,
                e.seq as i64,
                e.at as i64,
                serde_json::to_string(&e.input).expect("input")
            ],
        )
        .expect("journal row");
    }
}

fn user_version(store: &Path) -> i64 {
    rusqlite::Connection::open(store)
        .expect("open")
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version")
}

/// A store at schema version 1 holding `runs`, built with version 1's own migration.
fn v1_store(path: &Path, runs: &[&dagloop::store::StoredRun]) {
    dagloop::store::SqliteStore::create_at_version(path, 1).expect("v1");
    let db = rusqlite::Connection::open(path).expect("open");
    for r in runs {
        write_v1_run(&db, r);
    }
    assert_eq!(user_version(path), 1);
}

/// Two runs made by this build, read back: one finished, one waiting for decisions.
async fn two_runs(dir: &Path, url: &str) -> (dagloop::store::StoredRun, dagloop::store::StoredRun) {
    use dagloop::store::{RunStore, SqliteStore};
    let store = dir.join("made.db");
    let goal = write_goal(dir, url, None, false);
    let done = run_ok(&store, &goal, &[]);
    let waiting = run_ok(&store, &goal, &["--approve", "ask", "--detach"]);
    assert_eq!(json_of(&waiting)["status"], "waiting");
    let s = SqliteStore::open(&store).expect("store");
    let done = s.load(&run_id_of(&done)).expect("load");
    let waiting = s.load(&run_id_of(&waiting)).expect("load");
    assert!(done.result.is_some() && waiting.result.is_none());
    (done, waiting)
}

/// `dagloop runs` answers from the runs' rows with the list's query: `--status`, `--limit`,
/// waiting runs first; a bad flag value is a coded refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_lists_by_status_and_limit_waiting_first() {
    let (url, _) = counting_service().await;
    let dir = tempfile::tempdir().expect("dir");
    let store = dir.path().join("made.db");
    let goal = write_goal(dir.path(), &url, None, false);
    let waiting = run_id_of(&run_ok(&store, &goal, &["--approve", "ask", "--detach"]));
    let done = run_id_of(&run_ok(&store, &goal, &[]));
    let runs = |args: &[&str]| {
        let out = dagloop(&store)
            .args(["runs", "--json"])
            .args(args)
            .output()
            .expect("runs");
        (out.status.code(), json_of(&out))
    };
    let (code, all) = runs(&[]);
    assert_eq!(code, Some(0));
    let ids: Vec<&str> = all
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["id"].as_str())
        .collect();
    assert_eq!(
        ids,
        vec![waiting.as_str(), done.as_str()],
        "waiting first: {all}"
    );
    assert_eq!(all[0]["status"], "waiting");
    assert_eq!(all[0]["awaiting"], all[0]["waiting_approvals"]);
    assert!(all[0]["awaiting"].as_u64() >= Some(1), "{all}");
    assert!(
        all[0]["title"].as_str().is_some_and(|t| !t.is_empty()),
        "{all}"
    );
    assert_eq!(all[1]["status"], "succeeded");
    let (_, finished) = runs(&["--status", "finished"]);
    assert_eq!(finished.as_array().map(Vec::len), Some(1));
    assert_eq!(finished[0]["id"], done.as_str());
    let (_, one) = runs(&["--limit", "1"]);
    assert_eq!(one.as_array().map(Vec::len), Some(1));
    assert_eq!(one[0]["id"], waiting.as_str());
    for (args, code) in [
        (&["--status", "asleep"][..], "runs.bad_status"),
        (&["--limit", "0"][..], "runs.bad_limit"),
    ] {
        let (exit, v) = runs(args);
        assert_eq!(
            (exit, v["error"]["code"].as_str()),
            (Some(2), Some(code)),
            "{v}"
        );
    }
}

/// A store written at schema version 1 is upgraded in place the first time this build opens
/// it: its runs are listed and shown as before, and a run that was waiting is decided and
/// resumed to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_at_version_1_is_upgraded_in_place_and_its_runs_list_show_and_resume() {
    let (url, counts) = counting_service().await;
    let dir = tempfile::tempdir().expect("dir");
    let (done, waiting) = two_runs(dir.path(), &url).await;
    counts.lock().expect("counts").clear();
    let old = dir.path().join("old.db");
    v1_store(&old, &[&done, &waiting]);
    let listed = json_of(
        &dagloop(&old)
            .args(["runs", "--json"])
            .output()
            .expect("runs"),
    );
    assert_eq!(
        user_version(&old),
        dagloop::store::SCHEMA_VERSION,
        "upgraded in place"
    );
    let status = |id: &str| {
        listed
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["id"] == id)
            .map(|r| r["status"].clone())
    };
    assert_eq!(
        status(&done.record.id),
        Some(json!("succeeded")),
        "{listed}"
    );
    assert_eq!(
        status(&waiting.record.id),
        Some(json!("waiting")),
        "{listed}"
    );
    for run in [&done, &waiting] {
        let shown = json_of(
            &dagloop(&old)
                .args(["show", &run.record.id, "--json"])
                .output()
                .expect("show"),
        );
        assert_eq!(
            shown["journal_entries"].as_u64(),
            Some(run.journal.len() as u64),
            "{shown}"
        );
    }
    let finished = json_of(
        &dagloop(&old)
            .args(["show", &done.record.id, "--json"])
            .output()
            .expect("show"),
    );
    assert_eq!(finished["output"], json!({"total": {"n": 4, "v": 40}}));
    {
        use dagloop::store::{RunStore, SqliteStore};
        let s = SqliteStore::open(&old).expect("store");
        assert_eq!(
            s.load(&waiting.record.id).expect("load").journal,
            waiting.journal
        );
    }
    let run = &waiting.record.id;
    let result = approve_until_done(&old, run);
    assert_eq!(result["status"], "succeeded", "{result}");
    assert_eq!(result["output"], json!({"total": {"n": 4, "v": 40}}));
    let counts = counts.lock().expect("counts").clone();
    assert_eq!(counts, BTreeMap::from([(1, 1), (2, 1), (3, 1), (4, 1)]));
}

/// A store written by a newer dagloop is refused with `store.too_new` by every command, and
/// its file is left exactly as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_a_newer_version_is_refused_and_left_byte_for_byte_unchanged() {
    let (url, _counts) = counting_service().await;
    let dir = tempfile::tempdir().expect("dir");
    let (done, _) = two_runs(dir.path(), &url).await;
    let future = dir.path().join("made.db");
    {
        let db = rusqlite::Connection::open(&future).expect("open");
        db.pragma_update(None, "user_version", dagloop::store::SCHEMA_VERSION + 1)
            .expect("version");
        db.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .expect("checkpoint");
    }
    let wal = dir.path().join("made.db-wal");
    let bytes = std::fs::read(&future).expect("read");
    let goal = dir.path().join("goal.json");
    let id = done.record.id.as_str();
    for args in [
        vec!["runs", "--json"],
        vec!["show", id, "--json"],
        vec!["resume", id, "--json"],
        vec!["decide", id, "1", "approve"],
        vec!["runs", "prune", "--older-than", "0s"],
        vec!["run", goal.to_str().expect("path"), "--json"],
    ] {
        let out = dagloop(&future).args(&args).output().expect("dagloop");
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert_eq!(json_of(&out)["error"]["code"], "store.too_new", "{args:?}");
        assert!(
            std::fs::read(&future).expect("read") == bytes,
            "{args:?} changed the file"
        );
        assert_eq!(
            std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0),
            0,
            "{args:?} wrote to the WAL"
        );
    }
}

/// Processes that open a version-1 store at the same moment all succeed: one migrates, the
/// others wait for it and find the store current; nothing is migrated twice or lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_opening_a_version_1_store_at_once_all_succeed() {
    let (url, _counts) = counting_service().await;
    let dir = tempfile::tempdir().expect("dir");
    let (done, waiting) = two_runs(dir.path(), &url).await;
    let entries = (done.journal.len() + waiting.journal.len()) as i64;
    for round in 0..4 {
        let old = dir.path().join(format!("old-{round}.db"));
        v1_store(&old, &[&done, &waiting]);
        let outs = at_once(3, || {
            let mut c = dagloop(&old);
            c.args(["runs", "--json"]);
            c
        });
        for out in outs {
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stdout)
            );
            assert_eq!(json_of(&out).as_array().map(Vec::len), Some(2));
        }
        assert_eq!(user_version(&old), dagloop::store::SCHEMA_VERSION);
        let db = rusqlite::Connection::open(&old).expect("open");
        let (rows, total): (i64, i64) = db
            .query_row("SELECT count(*), sum(n) FROM journal", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .expect("count");
        assert_eq!(
            (rows, total),
            (entries, entries),
            "one row per old entry, each once"
        );
    }
}
