//! Fallback models through the binary (`dagloop run --model openai:a,openai:b`) against an
//! in-process OpenAI-compatible server on 127.0.0.1: a provider fault after the first model's
//! retries moves the turn to the second model (the `model_fallback` event, both models in the
//! result's usage, the request body naming the second model), a 400 does not, and `show` reads
//! the fallback back from the journal.
#![cfg(feature = "server")]

#[path = "common/bin.rs"]
mod bin;
mod common;
#[path = "common/model_runs.rs"]
mod model_runs;

use common::*;
use model_runs::*;
use serde_json::{Value, json};

/// Step 1 is answered by the first model; at step 2 it answers 503 to every attempt, so after
/// its four attempts the turn goes to the second model, which answers: the run succeeds, the
/// events say so, the usage names both models, and the second model was asked by its name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_fault_after_the_retries_falls_back_to_the_next_model() {
    let server = serve(vec![
        answer(greet_call()),
        unavailable(),
        unavailable(),
        unavailable(),
        unavailable(),
        answer(final_output()),
    ])
    .await;
    let dir = tempfile::tempdir().expect("dir");
    let events = dir.path().join("events.jsonl");
    let (code, r, stderr) = run(&server, "openai:a, openai:b", &["--no-store"], &events).await;
    assert_eq!(code, Some(0), "{r:#}\n{stderr}");
    assert_eq!(r["status"], "succeeded");
    assert_eq!(
        r["output"],
        json!({"name": "Ada", "greeting": "Hello, Ada!"})
    );
    // Both models answered a turn: each with its own figures (10 + 3 tokens a turn).
    let models = &r["usage"]["models"];
    assert_eq!(models["openai:a"]["input_tokens"], 10, "{r:#}");
    assert_eq!(models["openai:b"]["input_tokens"], 10, "{r:#}");
    assert_eq!(r["usage"]["input_tokens"], 20);
    // Six requests: one answer, four failed attempts of `a`, one answer of `b`.
    let sent: Vec<Value> = server
        .requests()
        .iter()
        .map(|q| q.body["model"].clone())
        .collect();
    assert_eq!(
        sent,
        ["a", "a", "a", "a", "a", "b"].map(Value::from).to_vec()
    );
    let evs = events_of(&events);
    let fallbacks: Vec<&Value> = evs
        .iter()
        .filter(|e| e["type"] == "model_fallback")
        .collect();
    assert_eq!(fallbacks.len(), 1, "{evs:#?}");
    let f = fallbacks[0];
    assert_eq!(
        (f["from"].as_str(), f["to"].as_str()),
        (Some("openai:a"), Some("openai:b")),
        "{f}"
    );
    assert_eq!(f["code"], "llm.http_status");
    assert_eq!(f["step"], 2);
    let retries = evs.iter().filter(|e| e["type"] == "model_retry").count();
    assert_eq!(retries, 3, "the first model's own retries come first");
}

/// A 400 is an error of the request itself: another model would not fix it, so the run ends
/// on the first model without asking the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_request_does_not_fall_back() {
    // Every request gets the 400.
    let server = serve(vec![Canned::status(
        400,
        r#"{"error": {"message": "invalid value for temperature"}}"#,
    )])
    .await;
    let dir = tempfile::tempdir().expect("dir");
    let events = dir.path().join("events.jsonl");
    let (code, r, stderr) = run(&server, "openai:a,openai:b", &["--no-store"], &events).await;
    assert_eq!(code, Some(1), "{r:#}\n{stderr}");
    assert_eq!(r["status"], "model_error", "{r:#}");
    assert_eq!(r["error"]["cause"]["code"], "llm.http_status", "{r:#}");
    let asked: Vec<Value> = server
        .requests()
        .iter()
        .map(|q| q.body["model"].clone())
        .collect();
    assert!(
        !asked.is_empty() && asked.iter().all(|m| m == "a"),
        "the second model was never asked: {asked:?}"
    );
    let evs = events_of(&events);
    assert!(
        !evs.iter().any(|e| e["type"] == "model_fallback"),
        "{evs:#?}"
    );
}

/// The id of the store's run, once its journal holds a fallback.
fn journaled_fallback(store: &std::path::Path) -> Option<String> {
    use dagloop::store::{RunStore, SqliteStore};
    let out = bin::dagloop()
        .env("DAGLOOP_STORE", store)
        .args(["runs", "--json"])
        .output()
        .ok()?;
    let listed: Value = serde_json::from_slice(&out.stdout).ok()?;
    let id = listed[0]["id"].as_str()?.to_string();
    let stored = SqliteStore::open(store).ok()?.load(&id).ok()?;
    stored
        .journal
        .iter()
        .any(|e| matches!(e.input, dagloop::RunInput::Fallback { .. }))
        .then_some(id)
}

/// A run killed while the second model answers the turn that fell back is resumed on the
/// second model (the journal says it was answering), not asked of the first again; `show` reads
/// the fallback back from the journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_after_a_kill_mid_fallback_keeps_the_journaled_model() {
    // The first model answers step 1 and fails step 2; the second never answers (it hangs).
    let mut hang = Canned::sse::<&str>(&[]);
    hang.pieces = vec![Piece::Hang];
    let first = serve(vec![
        answer(greet_call()),
        unavailable(),
        unavailable(),
        unavailable(),
        unavailable(),
        hang,
    ])
    .await;
    let dir = tempfile::tempdir().expect("dir");
    let store = dir.path().join("runs.db");
    let events = dir.path().join("events.jsonl");
    let mut child = bin::dagloop_tokio()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "run",
            TINY,
            "--json",
            "--model",
            "openai:a,openai:b",
            "--events",
        ])
        .arg(&events)
        .env("DAGLOOP_STORE", &store)
        .env("OPENAI_BASE_URL", first.openai_base())
        .env_remove("OPENAI_API_KEY")
        // The process is killed: a short lease, so that `resume` takes the run over soon after.
        .env("DAGLOOP_LEASE_MS", "500")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    // Wait until the second model is being asked (its request reached the server) and the
    // fallback is in the store's journal.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let id = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "no journaled fallback to the second model"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        if first.hits() < 6 {
            continue;
        }
        if let Some(id) = journaled_fallback(&store) {
            break id;
        }
    };
    child.kill().await.expect("kill");
    // The killed process's lease runs out before the run is continued.
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;

    let second = serve(vec![answer(final_output())]).await;
    let out = bin::dagloop_tokio()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["resume", &id, "--json"])
        .env("DAGLOOP_STORE", &store)
        .env("OPENAI_BASE_URL", second.openai_base())
        .env_remove("OPENAI_API_KEY")
        .output()
        .await
        .expect("resume");
    let r: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(out.status.code(), Some(0), "{r:#}");
    assert_eq!(
        r["output"],
        json!({"name": "Ada", "greeting": "Hello, Ada!"})
    );
    let asked: Vec<Value> = second
        .requests()
        .iter()
        .map(|q| q.body["model"].clone())
        .collect();
    assert_eq!(
        asked,
        vec![json!("b")],
        "the resumed turn goes to the journaled model"
    );
    assert_eq!(
        r["usage"]["models"]["openai:b"]["input_tokens"], 10,
        "{r:#}"
    );

    let shown = bin::dagloop()
        .env("DAGLOOP_STORE", &store)
        .args(["show", &id, "--json"])
        .output()
        .expect("show");
    let shown: Value = serde_json::from_slice(&shown.stdout).expect("show JSON");
    let f = &shown["model_fallbacks"];
    assert_eq!(f.as_array().map(Vec::len), Some(1), "{shown:#}");
    assert_eq!(
        (f[0]["from"].as_str(), f[0]["to"].as_str()),
        (Some("openai:a"), Some("openai:b"))
    );
    assert_eq!(f[0]["step"], 2);
    assert!(
        shown["usage"]["models"]["openai:a"].is_object(),
        "{shown:#}"
    );
}

/// A goal file's `model` may be an array: here two scripted models, their paths relative to the
/// goal file; the first answers 503 to every attempt, the second answers, and `dagloop validate`
/// accepts the list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_goal_files_model_array_falls_back_between_scripted_models() {
    let dir = tempfile::tempdir().expect("dir");
    let down = json!({"error": {"status": 503, "retry_after_s": 0}});
    std::fs::write(
        dir.path().join("down.json"),
        json!({"turns": [down, down, down, down]}).to_string(),
    )
    .expect("down");
    std::fs::write(
        dir.path().join("up.json"),
        json!({"turns": [{"solution": final_output()}]}).to_string(),
    )
    .expect("up");
    let goal = json!({
        "goal": "Say hello to Ada.",
        "model": ["scripted:down.json", "scripted:up.json"],
        "state": {"greeting": {"greeting": "Hello, Ada!"}},
        "output_schema": {"type": "object", "required": ["name", "greeting"],
                          "properties": {"name": {"type": "string"}, "greeting": {"type": "string"}}}
    });
    let goal_path = dir.path().join("goal.json");
    std::fs::write(&goal_path, goal.to_string()).expect("goal");
    let events = dir.path().join("events.jsonl");
    let out = bin::dagloop_tokio()
        .arg("run")
        .arg(&goal_path)
        .args(["--json", "--no-store", "--events"])
        .arg(&events)
        .output()
        .await
        .expect("run");
    let r: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(out.status.code(), Some(0), "{r:#}");
    assert_eq!(
        r["output"],
        json!({"name": "Ada", "greeting": "Hello, Ada!"})
    );
    let evs = events_of(&events);
    let f: Vec<&Value> = evs
        .iter()
        .filter(|e| e["type"] == "model_fallback")
        .collect();
    assert_eq!(f.len(), 1, "{evs:#?}");
    assert!(
        f[0]["from"]
            .as_str()
            .is_some_and(|m| m.ends_with("down.json")),
        "{}",
        f[0]
    );
    assert!(
        f[0]["to"].as_str().is_some_and(|m| m.ends_with("up.json")),
        "{}",
        f[0]
    );

    let out = bin::dagloop()
        .arg("validate")
        .arg(&goal_path)
        .output()
        .expect("validate");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The greet call and the output in one answer.
fn greet_and_output() -> Value {
    let mut s = greet_call();
    s["output"] = final_output()["output"].clone();
    s
}

/// Where in the answer's text its first call has been written whole (the stream breaks just
/// after it, so the run has taken the call before the break).
fn after_first_call(solution: &Value) -> usize {
    let text = solution.to_string();
    text.find("]").map_or(text.len(), |i| i + 1)
}

/// A stream that drops after its answer started (the greet call already taken) is asked again
/// of the same model without streaming: the whole answer's first call is the one already taken
/// (skipped, not run twice), its output ends the run. A `stream_reasked` event says so, no
/// model falls back, and a replay of the journal reproduces the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_breaks_after_content_is_asked_again_without_streaming() {
    let s = greet_and_output();
    let server = serve(vec![broken(&s, after_first_call(&s)), whole(&s)]).await;
    let dir = tempfile::tempdir().expect("dir");
    let store = dir.path().join("runs.db");
    let events = dir.path().join("events.jsonl");
    let store_arg = store.display().to_string();
    let (code, r, stderr) = run(
        &server,
        "openai:a,openai:b",
        &["--store", &store_arg],
        &events,
    )
    .await;
    assert_eq!(code, Some(0), "{r:#}\n{stderr}");
    assert_eq!(
        r["output"],
        json!({"name": "Ada", "greeting": "Hello, Ada!"})
    );
    assert_eq!(r["steps"], 1, "{r:#}");
    assert_eq!(
        r["calls"].as_array().map(Vec::len),
        Some(1),
        "one greet call: {r:#}"
    );
    assert_eq!(
        asked(&server),
        vec![(json!(true), json!("a")), (json!(false), json!("a"))],
        "streamed, then asked again whole, of the same model"
    );
    let evs = events_of(&events);
    let reasked: Vec<&Value> = evs
        .iter()
        .filter(|e| e["type"] == "stream_reasked")
        .collect();
    assert_eq!(reasked.len(), 1, "{evs:#?}");
    assert_eq!(reasked[0]["model"], "openai:a");
    assert_eq!(reasked[0]["calls_kept"], 1, "{}", reasked[0]);
    assert!(!evs.iter().any(|e| e["type"] == "model_fallback"));
    assert_eq!(
        evs.iter().filter(|e| e["type"] == "call_received").count(),
        1,
        "the call is not taken twice"
    );

    let out = bin::dagloop()
        .env("DAGLOOP_STORE", &store)
        .args(["runs", "--json"])
        .output()
        .expect("runs");
    let listed: Value = serde_json::from_slice(&out.stdout).expect("runs JSON");
    let id = listed[0]["id"].as_str().expect("id").to_string();
    let out = bin::dagloop()
        .env("DAGLOOP_STORE", &store)
        .args(["replay", &id])
        .output()
        .expect("replay");
    let replayed: Value = serde_json::from_slice(&out.stdout).expect("replay JSON");
    assert_eq!(replayed["status"], "identical", "{replayed:#}");
}

/// A stream broken after its first call, then `whole` as each of the four attempts of the
/// whole re-ask, then the next model's streamed answer: the run must succeed with the call
/// taken once, `stream_reasked` then `model_fallback`, and only the second model's usage (the
/// broken and failed answers report none). Returns the requests' (stream, model).
async fn reask_fails_then_falls_back(whole: Canned) -> Vec<(Value, Value)> {
    let s = greet_and_output();
    let mut answers = vec![broken(&s, after_first_call(&s))];
    answers.extend(std::iter::repeat_n(whole, 4));
    answers.push(answer(s.clone()));
    let server = serve(answers).await;
    let dir = tempfile::tempdir().expect("dir");
    let events = dir.path().join("events.jsonl");
    let (code, r, stderr) = run(&server, "openai:a,openai:b", &["--no-store"], &events).await;
    assert_eq!(code, Some(0), "{r:#}\n{stderr}");
    assert_eq!(
        r["output"],
        json!({"name": "Ada", "greeting": "Hello, Ada!"})
    );
    assert_eq!(
        r["calls"].as_array().map(Vec::len),
        Some(1),
        "the call taken before the break is not taken again: {r:#}"
    );
    let evs = events_of(&events);
    let kinds: Vec<&str> = evs
        .iter()
        .filter_map(|e| e["type"].as_str())
        .filter(|t| ["stream_reasked", "model_fallback"].contains(t))
        .collect();
    assert_eq!(kinds, ["stream_reasked", "model_fallback"], "{evs:#?}");
    assert_eq!(
        (&r["usage"]["input_tokens"], &r["usage"]["output_tokens"]),
        (&json!(10), &json!(3)),
        "{r:#}"
    );
    asked(&server)
}

/// When the whole request fails too (a 503 on every attempt), the turn falls back to the next
/// model, which streams the answer; the call taken before the break is not taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_stream_whose_reask_fails_falls_back_to_the_next_model() {
    let asked = reask_fails_then_falls_back(unavailable()).await;
    let (t, f) = (json!(true), json!(false));
    let (a, b) = (json!("a"), json!("b"));
    assert_eq!(
        asked,
        vec![
            (t.clone(), a.clone()),
            (f.clone(), a.clone()),
            (f.clone(), a.clone()),
            (f.clone(), a.clone()),
            (f, a),
            (t, b)
        ]
    );
}

/// A whole (`stream: false`) answer whose connection drops halfway through its body.
fn cut_whole(solution: &Value) -> Canned {
    let mut c = whole(solution);
    let bytes = match c.pieces.first() {
        Some(Piece::Bytes(b)) => b.clone(),
        _ => Vec::new(),
    };
    c.pieces = vec![
        Piece::Bytes(bytes[..bytes.len() / 2].to_vec()),
        Piece::Sleep(std::time::Duration::from_millis(100)),
        Piece::Break,
    ];
    c
}

/// The stream is cut mid-answer, and so is the non-streamed re-ask on the same model (its body
/// drops halfway, on every attempt): the turn falls back to the next model, which streams the
/// answer. The server's request log shows the order: streamed on `a`, asked whole on `a` (its
/// attempts), then streamed on `b`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_again_when_asked_whole_falls_back_to_the_next_model() {
    let asked = reask_fails_then_falls_back(cut_whole(&greet_and_output())).await;
    let (t, f) = (json!(true), json!(false));
    let (a, b) = (json!("a"), json!("b"));
    assert_eq!(asked.first(), Some(&(t.clone(), a.clone())), "{asked:?}");
    assert_eq!(asked.last(), Some(&(t, b)), "{asked:?}");
    let middle = &asked[1..asked.len() - 1];
    assert!(
        !middle.is_empty() && middle.iter().all(|q| *q == (f.clone(), a.clone())),
        "asked whole on `a` between: {asked:?}"
    );
}
