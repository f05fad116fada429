//! Sessions through the binary (spec/sessions.md): `dagloop run --continue RUN TEXT` starts a
//! follow-up from the run's final state with its history in context (checked on the request
//! the OpenAI-compatible loopback server received), the follow-up is the run's child (`show`,
//! `runs --session`) and replays identically, follow-ups of one session are serialised (a
//! second waits; with `--no-wait` it is refused `session.busy`), and `POST /runs/{id}/continue`
//! refuses a principal who may not read the run.
#![cfg(feature = "server")]

#[path = "common/bin.rs"]
mod bin;
mod common;
#[path = "common/model_runs.rs"]
mod model_runs;
#[path = "common/serve.rs"]
mod serve;

use std::path::Path;

use common::*;
use model_runs::*;
use serde_json::{Value, json};

/// Runs `dagloop ARGS --json --store STORE` against the loopback model server: exit code,
/// stdout as JSON, stderr.
async fn dl(server: &TestServer, store: &Path, args: &[&str]) -> (Option<i32>, Value, String) {
    let out = bin::dagloop_tokio()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .arg("--json")
        .arg("--store")
        .arg(store)
        .env("OPENAI_BASE_URL", server.openai_base())
        .env_remove("OPENAI_API_KEY")
        .output()
        .await
        .expect("dagloop");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let v = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}{stderr}"));
    (out.status.code(), v, stderr)
}

/// The first run of a session: greet Ada (state `greeting`), then answer.
async fn first_run(server: &TestServer, store: &Path) -> String {
    let (code, r, stderr) = dl(server, store, &["run", TINY, "--model", "openai:m"]).await;
    assert_eq!(code, Some(0), "{r:#}\n{stderr}");
    assert_eq!(r["state"]["greeting"]["greeting"], "Hello, Ada!");
    r["run_id"].as_str().expect("run_id").to_string()
}

/// The follow-up's first step: a call that reads what the first run wrote to state.
fn reads_the_first_runs_state() -> Value {
    json!({"calls": [{"_tool": "greet", "name": "†state.greeting.greeting",
                      "_output": {"greeting": "Hello again!"}, "_outputPath": "†state.again"}],
           "output": null})
}

fn again_output() -> Value {
    json!({"calls": [], "output": {"name": "†state.greeting.greeting", "greeting": "†state.again.greeting"}})
}

/// The text of every message of a chat-completions request.
fn contents(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| m["content"].as_str().unwrap_or("").to_string())
        .collect()
}

/// A follow-up starts from the run's final state with a summary of its history in the model's
/// context (the request sent shows both, and the new instruction as the goal); its call reads
/// the first run's state; it is the run's child (`show`, `runs --session`); and `dagloop
/// replay` of it is identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_starts_from_the_runs_state_and_history_and_replays() {
    let server = serve(vec![
        answer(greet_call()),
        answer(final_output()),
        answer(reads_the_first_runs_state()),
        answer(again_output()),
    ])
    .await;
    let dir = tempfile::tempdir().expect("dir");
    let store = dir.path().join("runs.db");
    let first = first_run(&server, &store).await;
    let text = "Greet them again, using the greeting as the name.";
    let (code, r, stderr) = dl(
        &server,
        &store,
        &["run", "--continue", &first, text, "--model", "openai:m"],
    )
    .await;
    assert_eq!(code, Some(0), "{r:#}\n{stderr}");
    assert_eq!(
        r["output"],
        json!({"name": "Hello, Ada!", "greeting": "Hello again!"}),
        "the follow-up read the first run's state"
    );
    let child = r["run_id"].as_str().expect("run_id").to_string();
    assert_ne!(child, first);

    // What the model was sent for the follow-up's first step.
    let sent = server.requests();
    assert_eq!(sent.len(), 4);
    let msgs = contents(&sent[2].body);
    assert_eq!(msgs[1], text, "the instruction is the goal: {msgs:#?}");
    let summary = msgs
        .iter()
        .find(|m| m.starts_with("Earlier in this session"))
        .unwrap_or_else(|| panic!("no history in {msgs:#?}"));
    for part in [
        first.as_str(),
        "Greet the person named in the input",
        "\"greet\"",
        "\"done\"",
        "\"Ada\"",
        "Hello, Ada!",
    ] {
        assert!(summary.contains(part), "{part} not in {summary}");
    }
    let state = msgs
        .iter()
        .find_map(|m| {
            serde_json::from_str::<Value>(m)
                .ok()
                .filter(|v| v["type"] == "state")
        })
        .unwrap_or_else(|| panic!("no state in {msgs:#?}"));
    assert_eq!(state["data"]["greeting"]["greeting"], "Hello, Ada!");
    // The first run's own first request carried no history.
    assert!(
        !contents(&sent[0].body)
            .iter()
            .any(|m| m.starts_with("Earlier in this session"))
    );

    // The follow-up is the first run's child, in its session.
    let (_, shown, _) = dl(&server, &store, &["show", &child]).await;
    assert_eq!(
        shown["session"],
        json!({"root": first, "parent": first}),
        "{shown:#}"
    );
    assert_eq!(shown["calls"][0]["tool"], "greet");
    assert_eq!(shown["calls"][0]["status"], "done");
    let ids: Vec<&str> = shown["session_runs"]
        .as_array()
        .expect("session_runs")
        .iter()
        .filter_map(|r| r["id"].as_str())
        .collect();
    assert_eq!(ids, [first.as_str(), child.as_str()]);
    let (code, listed, _) = dl(&server, &store, &["runs", "--session", &first]).await;
    assert_eq!(code, Some(0));
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed:#}");

    // Replayed offline from its record and journal: identical.
    let out = bin::dagloop()
        .args(["replay", &child, "--store"])
        .arg(&store)
        .output()
        .expect("replay");
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("identical"), "{said}");
}

/// A compacted run (its journal dropped) is followed like a whole one: the follow-up starts
/// from its final state (kept with its result) and its history summary lists its calls from
/// the description kept in the journal's place; the follow-up replays identically.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_run_is_followed_from_its_result_and_kept_description() {
    let server = serve(vec![
        answer(greet_call()),
        answer(final_output()),
        answer(reads_the_first_runs_state()),
        answer(again_output()),
    ])
    .await;
    let dir = tempfile::tempdir().expect("dir");
    let store = dir.path().join("runs.db");
    let first = first_run(&server, &store).await;
    let out = bin::dagloop()
        .args(["runs", "compact", &first, "--store"])
        .arg(&store)
        .output()
        .expect("compact");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = bin::dagloop()
        .args(["replay", &first, "--store"])
        .arg(&store)
        .output()
        .expect("replay");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("store.compacted"),
        "the journal is gone: {said}"
    );
    let text = "Greet them again, using the greeting as the name.";
    let (code, r, stderr) = dl(
        &server,
        &store,
        &["run", "--continue", &first, text, "--model", "openai:m"],
    )
    .await;
    assert_eq!(code, Some(0), "{r:#}\n{stderr}");
    assert_eq!(
        r["output"],
        json!({"name": "Hello, Ada!", "greeting": "Hello again!"}),
        "the follow-up read the compacted run's final state"
    );
    let child = r["run_id"].as_str().expect("run_id").to_string();
    let msgs = contents(&server.requests()[2].body);
    let summary = msgs
        .iter()
        .find(|m| m.starts_with("Earlier in this session"))
        .unwrap_or_else(|| panic!("no history in {msgs:#?}"));
    for part in [first.as_str(), "\"greet\"", "\"done\"", "Hello, Ada!"] {
        assert!(summary.contains(part), "{part} not in {summary}");
    }
    let (_, shown, _) = dl(&server, &store, &["show", &child]).await;
    assert_eq!(shown["session"], json!({"root": first, "parent": first}));
    let out = bin::dagloop()
        .args(["replay", &child, "--store"])
        .arg(&store)
        .output()
        .expect("replay");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("identical"), "{said}");
}

/// `--carry state` takes the state over and no history; `--carry history` the history and
/// not the state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn carry_says_what_goes_over() {
    let server = serve(vec![
        answer(greet_call()),
        answer(final_output()),
        answer(
            json!({"calls": [], "output": {"name": "Ada", "greeting": "†state.greeting.greeting"}}),
        ),
        answer(json!({"calls": [], "output": {"name": "Ada", "greeting": "hi"}})),
    ])
    .await;
    let dir = tempfile::tempdir().expect("dir");
    let store = dir.path().join("runs.db");
    let first = first_run(&server, &store).await;
    let (code, r, e) = dl(
        &server,
        &store,
        &["run", "--continue", &first, "again", "--carry", "state"],
    )
    .await;
    assert_eq!(code, Some(0), "{r:#}\n{e}");
    let (code, r, e) = dl(
        &server,
        &store,
        &["run", "--continue", &first, "again", "--carry", "history"],
    )
    .await;
    assert_eq!(code, Some(0), "{r:#}\n{e}");
    let sent = server.requests();
    let (state_only, history_only) = (contents(&sent[2].body), contents(&sent[3].body));
    let has_history = |m: &[String]| m.iter().any(|t| t.starts_with("Earlier in this session"));
    let has_state = |m: &[String]| {
        m.iter()
            .any(|t| t.contains("Hello, Ada!") && t.contains("\"type\":\"state\""))
    };
    assert!(
        has_state(&state_only) && !has_history(&state_only),
        "{state_only:#?}"
    );
    assert!(
        has_history(&history_only) && !has_state(&history_only),
        "{history_only:#?}"
    );
}

/// Two follow-ups of one session at once: while the first runs (its model answers slowly), a
/// second with `--no-wait` is refused `session.busy`, and one without waits for the first to
/// end before it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_ups_of_one_session_are_serialised() {
    let mut slow = answer(
        json!({"calls": [], "output": {"name": "A", "greeting": "†state.greeting.greeting"}}),
    );
    slow.head_delay = Some(std::time::Duration::from_millis(2500));
    let server = serve(vec![
        answer(greet_call()),
        answer(final_output()),
        slow,
        answer(
            json!({"calls": [], "output": {"name": "B", "greeting": "†state.greeting.greeting"}}),
        ),
    ])
    .await;
    let dir = tempfile::tempdir().expect("dir");
    let store = dir.path().join("runs.db");
    let first = first_run(&server, &store).await;
    let a = {
        let (server, store, first) = (&server, &store, first.clone());
        async move { dl(server, store, &["run", "--continue", &first, "A"]).await }
    };
    let others = async {
        // Once A is recorded (two runs in the session), B without waiting is refused.
        for _ in 0..200 {
            let (_, l, _) = dl(&server, &store, &["runs", "--session", &first]).await;
            if l.as_array().map(Vec::len) == Some(2) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        let refused = dl(
            &server,
            &store,
            &["run", "--continue", &first, "B", "--no-wait"],
        )
        .await;
        let waited = dl(&server, &store, &["run", "--continue", &first, "B"]).await;
        (refused, waited)
    };
    let ((a_code, a_out, a_err), ((r_code, r_out, _), (b_code, b_out, b_err))) =
        tokio::join!(a, others);
    assert_eq!(a_code, Some(0), "{a_out:#}\n{a_err}");
    assert_eq!(r_code, Some(2), "{r_out:#}");
    assert_eq!(r_out["error"]["code"], "session.busy", "{r_out:#}");
    assert_eq!(b_code, Some(0), "{b_out:#}\n{b_err}");
    assert_eq!(a_out["output"]["name"], "A");
    assert_eq!(b_out["output"]["name"], "B");
    // B began after A ended.
    let shown = |id: &str| {
        let out = bin::dagloop()
            .args(["show", id, "--json", "--store"])
            .arg(&store)
            .output()
            .expect("show");
        serde_json::from_slice::<Value>(&out.stdout).expect("JSON")
    };
    let (sa, sb) = (
        shown(a_out["run_id"].as_str().expect("a")),
        shown(b_out["run_id"].as_str().expect("b")),
    );
    let a_end =
        sa["started_at"].as_u64().expect("a started") + sa["duration_ms"].as_u64().expect("a ms");
    let b_start = sb["started_at"].as_u64().expect("b started");
    assert!(
        b_start >= a_end,
        "B started at {b_start}, before A ended at {a_end}"
    );
    // Only three runs: the refused follow-up left none.
    let (_, l, _) = dl(&server, &store, &["runs", "--session", &first]).await;
    assert_eq!(l.as_array().map(Vec::len), Some(3), "{l:#}");
}

/// `POST /runs/{id}/continue`: a principal who may not read the run gets 404 (as for a run that
/// does not exist) and nothing is recorded; its submitter gets 201, a follow-up in the run's
/// session that it owns and that the other principal cannot read either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_continues_only_runs_the_caller_may_read() {
    use serve::*;
    let dir = tempfile::tempdir().expect("dir");
    let store = dir.path().join("runs.db");
    let p = |name: &str, token: &str| json!({"name": name, "token_sha256": dagloop::server::token_sha256(token), "roles": ["submit"]});
    let principals = dir.path().join("principals.json");
    std::fs::write(
        &principals,
        json!([p("ci", "token-ci"), p("other", "token-other")]).to_string(),
    )
    .expect("principals");
    let s = Server::start_with(&store, None, |c| {
        c.arg("--principals").arg(&principals);
    });
    let (url, _) = counting_service().await;
    let g = goal(dir.path(), &url, "auto");
    let (status, v) = send(
        client()
            .post(s.url("/runs"))
            .bearer_auth("token-ci")
            .json(&g),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().expect("id").to_string();
    for _ in 0..400 {
        let (_, v) = send(
            client()
                .get(s.url(&format!("/runs/{id}")))
                .bearer_auth("token-ci"),
        )
        .await;
        if v["status"] == "succeeded" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let cont = |token: &str| {
        client()
            .post(s.url(&format!("/runs/{id}/continue")))
            .bearer_auth(token)
            .json(&json!({"text": "do it again"}))
    };
    refused(send(cont("token-other")).await, 404, "store.unknown_run");
    let (status, v) = send(cont("token-ci")).await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["session"], json!({"root": id, "parent": id}));
    let child = v["id"].as_str().expect("id").to_string();
    let mut last = Value::Null;
    for _ in 0..400 {
        let (_, v) = send(
            client()
                .get(s.url(&format!("/runs/{child}")))
                .bearer_auth("token-ci"),
        )
        .await;
        last = v;
        if last["status"] == "succeeded" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(last["status"], "succeeded", "{last:#}");
    assert_eq!(last["session"]["root"], id.as_str());
    assert_eq!(last["submitted_by"], "ci");
    refused(
        send(
            client()
                .get(s.url(&format!("/runs/{child}")))
                .bearer_auth("token-other"),
        )
        .await,
        404,
        "store.unknown_run",
    );
    // The session's runs, listed: two for its owner.
    let (status, v) = send(
        client()
            .get(s.url(&format!("/runs?session={id}")))
            .bearer_auth("token-ci"),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v.as_array().map(Vec::len), Some(2), "{v:#}");
}

/// A run of the session whose process was killed (its lease ran out: it is stopped) is not
/// waited for: a follow-up that would wait is refused `session.busy` at once, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_run_of_the_session_is_not_waited_for() {
    let mut hang = Canned::sse(&[oa_delta(json!({"role": "assistant", "content": ""}))]);
    hang.pieces.push(Piece::Hang);
    let server = serve(vec![answer(greet_call()), answer(final_output()), hang]).await;
    let dir = tempfile::tempdir().expect("dir");
    let store = dir.path().join("runs.db");
    let first = first_run(&server, &store).await;
    let mut a = bin::dagloop_tokio()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["run", "--continue", &first, "A", "--json", "--store"])
        .arg(&store)
        .env("OPENAI_BASE_URL", server.openai_base())
        .env("DAGLOOP_LEASE_MS", "300")
        .env_remove("OPENAI_API_KEY")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    // A asked its model (which never answers): kill it there.
    for _ in 0..400 {
        if server.hits() >= 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(server.hits(), 3);
    a.kill().await.expect("kill");
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let started = std::time::Instant::now();
    let (code, r, _) = dl(&server, &store, &["run", "--continue", &first, "B"]).await;
    assert_eq!(code, Some(2), "{r:#}");
    assert_eq!(r["error"]["code"], "session.busy", "{r:#}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}
