//! Issue 27: `dagloop replay` through the real binary, on real runs. A run of the delegate
//! example and one of the http lookup goal replay `identical`; a journal edited in the SQLite
//! file (an entry dropped, a recorded result changed) is reported as the first divergence with
//! its sequence number, exit 1. A run exported as a cassette re-runs offline, its tool service
//! stopped, to the same output; a changed param is a `cassette.miss` (spec/replay.md).

#[path = "common/e2e.rs"]
mod harness;

use std::path::{Path, PathBuf};

use harness::{MockLlm, ToolServer, Workspace};
use serde_json::Value;

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name)
}

/// `dagloop --store DB ARGS...`, its exit code and stdout as JSON.
async fn dagloop(db: &Path, args: &[&str]) -> (i32, Value) {
    let mut all = vec!["--store", db.to_str().expect("utf-8 path")];
    all.extend(args);
    let run = harness::dagloop(all).await;
    (run.code, run.json())
}

/// Runs `goal` into `db`; returns the run id.
async fn run(db: &Path, goal: &Path) -> String {
    let (code, r) = dagloop(db, &["run", goal.to_str().expect("path"), "--json"]).await;
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(r["status"], "succeeded", "{r:#}");
    r["run_id"].as_str().expect("run_id").to_string()
}

/// Every journal line of `run` as (row seq, line index, text).
fn journal_lines(db: &Path, run: &str) -> Vec<(i64, usize, String)> {
    let c = rusqlite::Connection::open(db).expect("open store");
    let mut stmt = c
        .prepare("SELECT seq, inputs FROM journal WHERE run_id = ?1 ORDER BY seq")
        .expect("prepare");
    let rows = stmt
        .query_map([run], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
        .expect("query");
    let mut out = Vec::new();
    for row in rows {
        let (seq, text) = row.expect("row");
        for (i, line) in text.split('\n').enumerate() {
            out.push((seq, i, line.to_string()));
        }
    }
    out
}

/// The sequence number `dagloop` gives the first journal line containing `needle`.
fn seq_of(db: &Path, run: &str, needle: &str) -> u64 {
    journal_lines(db, run)
        .into_iter()
        .find(|(_, _, l)| l.contains(needle))
        .map(|(seq, i, _)| seq as u64 + i as u64)
        .unwrap_or_else(|| panic!("no journal line contains {needle}"))
}

/// Rewrites the first journal line containing `needle` with `edit` (None drops it).
fn edit_journal(db: &Path, run: &str, needle: &str, edit: impl Fn(&str) -> Option<String>) {
    let c = rusqlite::Connection::open(db).expect("open store");
    let (seq, text): (i64, String) = c
        .query_row(
            "SELECT seq, inputs FROM journal WHERE run_id = ?1 AND instr(inputs, ?2) > 0 ORDER BY seq",
            rusqlite::params![run, needle],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("a journal row holds the needle");
    let mut done = false;
    let lines: Vec<String> = text
        .split('\n')
        .filter_map(|l| {
            if !done && l.contains(needle) {
                done = true;
                edit(l)
            } else {
                Some(l.to_string())
            }
        })
        .collect();
    if lines.is_empty() {
        c.execute(
            "DELETE FROM journal WHERE run_id = ?1 AND seq = ?2",
            rusqlite::params![run, seq],
        )
        .expect("delete row");
    } else {
        c.execute(
            "UPDATE journal SET inputs = ?3, n = ?4 WHERE run_id = ?1 AND seq = ?2",
            rusqlite::params![run, seq, lines.join("\n"), lines.len() as i64],
        )
        .expect("update row");
    }
}

/// Every example that runs offline (its tools answered from its `tools.json` where it has one)
/// replays `identical`: the check a user runs after upgrading dagloop.
#[tokio::test]
async fn every_example_replays_identical() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("runs.db");
    for name in ["delegate", "first-goal", "refund", "research"] {
        let goal = example(&format!("{name}/goal.json"));
        let tools = example(&format!("{name}/tools.json"));
        let mut args = vec!["run", goal.to_str().expect("path"), "--json"];
        if tools.exists() {
            args.extend(["--tools-from", tools.to_str().expect("path")]);
        }
        let (code, r) = dagloop(&db, &args).await;
        assert_eq!(code, 0, "{name}: {r:#}");
        assert_eq!(r["status"], "succeeded", "{name}: {r:#}");
        let id = r["run_id"].as_str().expect("run_id");
        let (code, replayed) = dagloop(&db, &["replay", id]).await;
        assert_eq!(code, 0, "{name}: {replayed:#}");
        assert_eq!(replayed["status"], "identical", "{name}: {replayed:#}");
    }
}

#[tokio::test]
async fn the_delegate_example_replays_identical_and_an_edited_journal_diverges() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("runs.db");
    let id = run(&db, &example("delegate/goal.json")).await;

    let (code, r) = dagloop(&db, &["replay", &id]).await;
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(r["status"], "identical", "{r:#}");
    assert_eq!(r["run_status"], "succeeded", "{r:#}");
    assert!(r["events"].as_u64().unwrap_or(0) > 10, "{r:#}");
    let digest = r["events_digest"].as_str().expect("digest").to_string();
    assert!(digest.starts_with("sha256:"), "{r:#}");
    // Deterministic: a second replay gives the same digest.
    let (_, again) = dagloop(&db, &["replay", &id]).await;
    assert_eq!(again["events_digest"], digest.as_str());

    // The translator's answer says something else: the state differs from the stored result.
    edit_journal(&db, &id, "Bonjour Camille", |l| {
        Some(l.replace("Bonjour Camille", "Hello Camille"))
    });
    let (code, r) = dagloop(&db, &["replay", &id]).await;
    assert_eq!(code, 1, "{r:#}");
    assert_eq!(r["status"], "diverged", "{r:#}");
    let d = &r["divergence"];
    assert_eq!(d["code"], "replay.result", "{r:#}");
    assert!(
        d["message"].as_str().unwrap_or("").contains("state"),
        "{r:#}"
    );
    assert!(
        d["expected"].to_string().contains("Bonjour Camille"),
        "{r:#}"
    );
    assert!(d["actual"].to_string().contains("Hello Camille"), "{r:#}");
    // Shown at the entry the replay finished at: the run's last stream close.
    let last = journal_lines(&db, &id).len() as u64;
    assert_eq!(d["seq"], last, "{r:#}");

    // The translator's turn never closes: the run's own model answers a turn it never asked
    // for (the machine waits for the delegate).
    let root_answer = seq_of(&db, &id, r#""output":{"ticketId""#);
    edit_journal(&db, &id, r#""stream_closed","frame":2"#, |_| None);
    let (code, r) = dagloop(&db, &["replay", &id]).await;
    assert_eq!(code, 1, "{r:#}");
    let d = &r["divergence"];
    assert_eq!(d["code"], "replay.unexpected_input", "{r:#}");
    assert_eq!(d["seq"], root_answer, "{r:#}");
    assert_eq!(d["actual"]["input"], "output", "{r:#}");
    assert_eq!(d["expected"]["model_turns"][0], "delegate call 2", "{r:#}");
}

#[tokio::test]
async fn an_http_run_replays_identical_and_a_dropped_outcome_is_named() {
    let server = ToolServer::start().await;
    let ws = Workspace::lookup(&server);
    let db = ws.path("runs.db");
    let id = run(&db, &ws.goal).await;
    let (code, r) = dagloop(&db, &["replay", &id]).await;
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(r["status"], "identical", "{r:#}");
    // Offline: the replay asked the tool server nothing.
    let hits = server.requests().len();
    let (code, _) = dagloop(&db, &["replay", &id]).await;
    assert_eq!(code, 0);
    assert_eq!(server.requests().len(), hits);

    // fetchCustomer's outcome is lost: scoreRisk (which reads it) was never launched, so its
    // outcome is the first input the fresh machine did not ask for.
    edit_journal(&db, &id, r#""name":"Ada","tier":"gold"}"#, |_| None);
    let next = seq_of(&db, &id, r#""score":0.2"#);
    let (code, r) = dagloop(&db, &["replay", &id]).await;
    assert_eq!(code, 1, "{r:#}");
    let d = &r["divergence"];
    assert_eq!(d["code"], "replay.unexpected_input", "{r:#}");
    assert_eq!(d["seq"], next, "{r:#}");
    assert_eq!(d["actual"]["input"], "outcome", "{r:#}");
    assert_eq!(d["actual"]["call"], 2, "{r:#}");
    assert!(
        d["message"].as_str().unwrap_or("").contains("call 2"),
        "{r:#}"
    );
}

#[tokio::test]
async fn replay_of_an_unknown_run_is_a_store_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("runs.db");
    // No store file: nothing is created.
    let (code, r) = dagloop(&db, &["replay", "run-nope"]).await;
    assert_eq!(code, 2, "{r:#}");
    assert_eq!(r["error"]["code"], "store.not_found", "{r:#}");
    assert!(!db.exists());
    run(&db, &example("delegate/goal.json")).await;
    for args in [
        &["replay", "run-nope"][..],
        &["export", "run-nope", "--cassette", "unused"][..],
    ] {
        let (code, r) = dagloop(&db, args).await;
        assert_eq!(code, 2, "{r:#}");
        assert_eq!(r["error"]["code"], "store.unknown_run", "{r:#}");
    }
}

/// `dagloop export RUN --cassette DIR`, which must succeed; the `model.json` it wrote.
async fn export(db: &Path, run: &str, cas: &Path) -> Value {
    let (code, r) = dagloop(
        db,
        &["export", run, "--cassette", cas.to_str().expect("path")],
    )
    .await;
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(r["status"], "exported", "{r:#}");
    // The documented form (docs/goal-files.md#cassettes): `result` or `error`, no Rust enum
    // names (`{"result": {"Ok": ...}}` was the form before).
    let tools = std::fs::read_to_string(cas.join("tools.json")).expect("tools.json");
    assert!(
        !tools.contains("\"Ok\"") && !tools.contains("\"Err\""),
        "Rust enum names in the cassette: {tools}"
    );
    serde_json::from_str(&std::fs::read_to_string(cas.join("model.json")).expect("model.json"))
        .expect("model.json is JSON")
}

/// `dagloop --store DB run GOAL --json --model scripted:DIR/model.json --tools-from
/// DIR/tools.json EXTRA...`.
async fn run_cassette(db: &Path, goal: &Path, cas: &Path, extra: &[&str]) -> (i32, Value) {
    let model = format!("scripted:{}", cas.join("model.json").display());
    let tools = cas.join("tools.json");
    let mut args = vec![
        "run",
        goal.to_str().expect("path"),
        "--json",
        "--model",
        &model,
        "--tools-from",
        tools.to_str().expect("path"),
    ];
    args.extend(extra);
    dagloop(db, &args).await
}

#[tokio::test]
async fn an_exported_cassette_reruns_offline_and_a_changed_param_is_a_cassette_miss() {
    let server = ToolServer::start().await;
    let ws = Workspace::lookup(&server);
    let db = ws.path("runs.db");
    let (code, original) = dagloop(&db, &["run", ws.goal.to_str().expect("path"), "--json"]).await;
    assert_eq!(code, 0, "{original:#}");
    let id = original["run_id"].as_str().expect("run_id");

    let cas = ws.path("cassette");
    let model = export(&db, id, &cas).await;
    let violations = dagloop::schema::published::Document::ScriptedModel
        .validator()
        .expect("schema")
        .validate(&model);
    assert!(violations.is_empty(), "{violations:?}\n{model:#}");
    assert_eq!(
        model["turns"].as_array().map(Vec::len),
        Some(2),
        "{model:#}"
    );
    // Each turn carries the tokens the run recorded for it.
    let turns_tokens: u64 = model["turns"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            t["usage"]["input_tokens"]
                .as_u64()
                .expect("usage in every turn")
        })
        .sum();
    assert_eq!(
        Some(turns_tokens),
        original["usage"]["input_tokens"].as_u64(),
        "{model:#}"
    );
    let tools: Value =
        serde_json::from_str(&std::fs::read_to_string(cas.join("tools.json")).expect("tools.json"))
            .expect("tools.json is JSON");
    let keys: Vec<(String, String)> = tools["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .map(|c| {
            (
                c["tool"].as_str().unwrap_or("").into(),
                c["params"].to_string(),
            )
        })
        .collect();
    assert_eq!(
        keys,
        [
            ("fetchCustomer".to_string(), r#"{"id":"c1"}"#.to_string()),
            ("scoreRisk".to_string(), r#"{"tier":"gold"}"#.to_string()),
        ],
        "{tools:#}"
    );

    // The tool service is gone: every call is answered from the recording.
    drop(server);
    let (code, again) = run_cassette(&db, &ws.goal, &cas, &[]).await;
    assert_eq!(code, 0, "{again:#}");
    assert_eq!(again["output"], original["output"], "{again:#}");
    assert_eq!(again["state"], original["state"], "{again:#}");
    assert_eq!(again["usage"], original["usage"], "{again:#}");

    // Another customer: the resolved params are not in the recording.
    let other = ws.path("other.goal.json");
    let mut goal: Value =
        serde_json::from_str(&std::fs::read_to_string(&ws.goal).expect("goal")).expect("goal");
    goal["input"]["customerId"] = "c9".into();
    std::fs::write(&other, goal.to_string()).expect("write goal");
    let (_, missed) = run_cassette(&db, &other, &cas, &[]).await;
    let first = &missed["calls"][0];
    assert_eq!(first["tool"], "fetchCustomer", "{missed:#}");
    assert_eq!(first["status"], "failed", "{missed:#}");
    assert_eq!(first["error"]["code"], "cassette.miss", "{missed:#}");
    assert_eq!(first["error"]["tool"], "fetchCustomer", "{missed:#}");
    assert_eq!(first["error"]["params"]["id"], "c9", "{missed:#}");

    // With passthrough the missing call runs for real (here: a live server that knows no c9).
    let live = ToolServer::start().await;
    let ws2 = Workspace::new("lookup.goal.json", "lookup.script.json", &live.base, |g| {
        g["input"]["customerId"] = "c9".into();
    });
    let (_, through) = run_cassette(&db, &ws2.goal, &cas, &["--tools-from-passthrough"]).await;
    assert_eq!(live.hits("/customers/c9"), 1, "{through:#}");
    assert_ne!(
        through["calls"][0]["error"]["code"], "cassette.miss",
        "{through:#}"
    );
}

/// `dagloop --store DB run ARGS... --json` with the OpenAI-compatible provider at `base_url`.
async fn with_provider(db: &Path, args: &[&str], base_url: &str) -> harness::Run {
    let mut all = vec!["--store", db.to_str().expect("path"), "run", "--json"];
    all.extend(args);
    let mut cmd = harness::command(all);
    cmd.env("OPENAI_BASE_URL", base_url)
        .env("OPENAI_API_KEY", "dummy");
    harness::finish(cmd.spawn().expect("start dagloop")).await
}

/// The run a user records is one against a real provider: here the OpenAI-compatible
/// `dagloop mock-llm` in a process of its own, spoken to over HTTP. Its cassette re-runs with
/// the model server and the tool service both gone, and the provider's address pointing at a
/// port nothing listens on: no request can leave, and the output is the same.
#[tokio::test]
async fn a_run_against_the_openai_compatible_mock_replays_from_its_cassette_with_no_network() {
    let server = ToolServer::start().await;
    let ws = Workspace::lookup(&server);
    let mock = MockLlm::start(&harness::fixture("lookup.script.json")).await;
    let db = ws.path("runs.db");
    let goal = ws.goal.to_str().expect("path");
    let online = with_provider(&db, &[goal, "--model", "openai:test"], &mock.base_url).await;
    assert_eq!(online.code, 0, "{}\n{}", online.stdout, online.stderr);
    let original = online.json();
    assert_eq!(original["status"], "succeeded", "{original:#}");
    let id = original["run_id"].as_str().expect("run_id");
    assert_eq!(server.hits("/customers/c1"), 1, "{original:#}");

    let cas = ws.path("cassette");
    let model = export(&db, id, &cas).await;
    assert_eq!(
        model["turns"].as_array().map(Vec::len),
        Some(2),
        "the two turns the mock streamed: {model:#}"
    );

    // Nothing to talk to any more.
    drop(mock);
    drop(server);
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead = format!("http://{}/v1", closed.local_addr().expect("addr"));
    drop(closed);
    let model_spec = format!("scripted:{}", cas.join("model.json").display());
    let tools = cas.join("tools.json");
    let offline = with_provider(
        &db,
        &[
            goal,
            "--model",
            &model_spec,
            "--tools-from",
            tools.to_str().expect("path"),
        ],
        &dead,
    )
    .await;
    assert_eq!(offline.code, 0, "{}\n{}", offline.stdout, offline.stderr);
    let again = offline.json();
    assert_eq!(again["status"], "succeeded", "{again:#}");
    assert_eq!(again["output"], original["output"], "{again:#}");
    assert_eq!(again["state"], original["state"], "{again:#}");
    assert_eq!(
        harness::call_statuses(&again),
        harness::call_statuses(&original),
        "{again:#}"
    );
    assert_ne!(again["run_id"], original["run_id"]);
}

#[tokio::test]
async fn the_server_serves_a_run_as_the_cassette_export_writes() {
    use tokio::io::AsyncBufReadExt;
    let server = ToolServer::start().await;
    let ws = Workspace::lookup(&server);
    let db = ws.path("runs.db");
    let id = run(&db, &ws.goal).await;
    let cas = ws.path("cassette");
    let (code, _) = dagloop(
        &db,
        &["export", &id, "--cassette", cas.to_str().expect("path")],
    )
    .await;
    assert_eq!(code, 0);

    let mut serve = harness::command([
        "serve",
        "--addr",
        "127.0.0.1:0",
        "--store",
        db.to_str().expect("path"),
    ])
    .spawn()
    .expect("spawn dagloop serve");
    let mut line = String::new();
    tokio::io::BufReader::new(serve.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .await
        .expect("read");
    let listening: Value = serde_json::from_str(&line).expect("the first line is JSON");
    let base = listening["url"]
        .as_str()
        .expect("url")
        .trim_end_matches('/');
    let client = dagloop::net::client().expect("client");
    let got: Value = client
        .get(format!("{base}/runs/{id}/cassette"))
        .send()
        .await
        .expect("GET cassette")
        .json()
        .await
        .expect("JSON");
    let file = |name: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(cas.join(name)).expect("file")).expect("json")
    };
    assert_eq!(got["model"], file("model.json"), "{got:#}");
    assert_eq!(got["tools"], file("tools.json"), "{got:#}");
    let missing = client
        .get(format!("{base}/runs/run-nope/cassette"))
        .send()
        .await
        .expect("GET");
    assert_eq!(missing.status().as_u16(), 404);
    let _ = serve.kill().await;
}

#[tokio::test]
async fn a_tools_recording_that_is_not_one_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("runs.db");
    let bad = dir.path().join("tools.json");
    std::fs::write(&bad, r#"{"calls": [{"tool": 1}]}"#).expect("write");
    let goal = example("delegate/goal.json");
    let (code, r) = dagloop(
        &db,
        &[
            "run",
            goal.to_str().expect("path"),
            "--json",
            "--tools-from",
            bad.to_str().expect("path"),
        ],
    )
    .await;
    assert_eq!(code, 2, "{r:#}");
    assert_eq!(r["error"]["code"], "cassette.invalid", "{r:#}");
}

#[tokio::test]
async fn a_run_killed_and_resumed_replays_identical_at_every_kill_point_tried() {
    let dir = tempfile::tempdir().expect("tempdir");
    let goal = example("delegate/goal.json");
    let mut killed = 0;
    for n in [2, 5, 8, 10] {
        let db = dir.path().join(format!("crash-{n}.db"));
        let mut cmd = harness::command([
            "--store",
            db.to_str().expect("path"),
            "run",
            goal.to_str().expect("path"),
            "--json",
        ]);
        // A short lease, so that the killed process's lease has expired when it is resumed.
        cmd.env("DAGLOOP_CRASH_AFTER_ENTRIES", n.to_string())
            .env("DAGLOOP_LEASE_MS", "200");
        let crashed = harness::finish(cmd.spawn().expect("spawn")).await;
        if crashed.code == 0 {
            continue; // one commit took the journal past n: nothing was killed at n
        }
        killed += 1;
        let (_, runs) = dagloop(&db, &["runs", "--json"]).await;
        let id = runs[0]["id"].as_str().expect("a stored run").to_string();
        // A stopped run replays to where it stopped (its machine may have finished before
        // the kill left the result unrecorded).
        let (code, r) = dagloop(&db, &["replay", &id]).await;
        assert_eq!(code, 0, "killed after {n}: {r:#}");
        assert_eq!(r["status"], "identical", "{r:#}");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let (code, done) = dagloop(&db, &["resume", &id, "--json"]).await;
        assert_eq!(code, 0, "{done:#}");
        let (code, r) = dagloop(&db, &["replay", &id]).await;
        assert_eq!(code, 0, "killed after {n}, resumed: {r:#}");
        assert_eq!(r["status"], "identical", "{r:#}");
        assert_eq!(r["run_status"], "succeeded", "{r:#}");
    }
    assert!(
        killed >= 2,
        "only {killed} of the kill points killed the run"
    );
}

#[tokio::test]
async fn decisions_replay_and_travel_in_the_cassette() {
    let server = ToolServer::start().await;
    let ws = Workspace::lookup(&server);
    let decisions = ws.path("decisions.json");
    std::fs::write(
        &decisions,
        r#"{"decisions": [{"tool": "fetchCustomer", "decision": "approve"},
                          {"tool": "scoreRisk", "decision": "approve"},
                          {"tool": "summarise", "decision": "approve"}]}"#,
    )
    .expect("write decisions");
    let db = ws.path("runs.db");
    let (code, original) = dagloop(
        &db,
        &[
            "run",
            ws.goal.to_str().expect("path"),
            "--json",
            "--approve",
            "ask",
            "--decisions",
            decisions.to_str().expect("path"),
        ],
    )
    .await;
    assert_eq!(code, 0, "{original:#}");
    let id = original["run_id"].as_str().expect("run_id");
    let (code, r) = dagloop(&db, &["replay", id]).await;
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(r["status"], "identical", "{r:#}");

    let cas = ws.path("cassette");
    let (code, _) = dagloop(
        &db,
        &["export", id, "--cassette", cas.to_str().expect("path")],
    )
    .await;
    assert_eq!(code, 0);
    let model: Value =
        serde_json::from_str(&std::fs::read_to_string(cas.join("model.json")).expect("model"))
            .expect("json");
    let decided: Vec<(u64, String)> = model["decisions"]
        .as_array()
        .expect("decisions exported")
        .iter()
        .map(|d| {
            (
                d["call"].as_u64().unwrap_or(0),
                d["decision"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        decided,
        // The latent summarise runs nothing, so nobody is asked about it.
        [(1, "approve".into()), (2, "approve".into())],
        "{model:#}"
    );
    // No terminal, no --decisions: the cassette's model file decides.
    drop(server);
    let (code, again) = run_cassette(&db, &ws.goal, &cas, &["--approve", "ask"]).await;
    assert_eq!(code, 0, "{again:#}");
    assert_eq!(again["state"], original["state"], "{again:#}");
}
