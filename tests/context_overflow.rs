//! Context overflow through the binary against an in-process OpenAI-compatible server on
//! 127.0.0.1 (spec/context.md C4-C6): a "context length exceeded" answer that names no window
//! makes the run ask the turn again compacted one level further (oldest large values first),
//! until it fits or the most compacted level is refused too (`run.context_overflow`); one that
//! names the window is met at once with the least level that fits, later steps are compacted
//! before they are asked, and a context whose smallest form cannot fit ends the run with the
//! sizes.
#![cfg(feature = "server")]

#[path = "common/bin.rs"]
mod bin;
mod common;
#[path = "common/model_runs.rs"]
mod model_runs;

use common::*;
use model_runs::*;
use serde_json::{Value, json};

/// The size of a request's messages as the limited server measures them (bytes of JSON).
fn dagloop_chars(body: &Value) -> usize {
    body["messages"].to_string().len()
}

/// A "context length exceeded" answer is its own error code, `llm.context_overflow`: an error
/// of the request, so it neither retries nor falls back. The turn is asked again of the same
/// model, compacted one level further each time; a model that refuses the most compacted
/// context too ends the run `run.context_overflow` (a status of its own), whose message gives
/// the size of each refused context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_that_never_fits_ends_the_run_context_overflow() {
    let server = serve(vec![overflow()]).await;
    let dir = tempfile::tempdir().expect("dir");
    let events = dir.path().join("events.jsonl");
    let (code, r, stderr) = run(&server, "openai:a,openai:b", &["--no-store"], &events).await;
    assert_eq!(code, Some(1), "{r:#}\n{stderr}");
    assert_eq!(r["status"], "context_overflow", "{r:#}");
    assert_eq!(r["error"]["code"], "run.context_overflow", "{r:#}");
    assert_eq!(r["error"]["cause"]["code"], "llm.context_overflow", "{r:#}");
    let sizes: Vec<usize> = server
        .requests()
        .iter()
        .map(|q| {
            assert_eq!(q.body["model"], "a", "never fallen back from");
            dagloop_chars(&q.body)
        })
        .collect();
    assert_eq!(
        sizes.len(),
        4,
        "the full context, then levels 1 to 3: {sizes:?}"
    );
    let refused = &r["error"]["cause"]["refused_chars"];
    assert_eq!(refused.as_array().map(Vec::len), Some(4), "{r:#}");
    let message = r["error"]["message"].as_str().unwrap_or_default();
    for n in refused.as_array().into_iter().flatten() {
        assert!(message.contains(&n.to_string()), "{message}");
    }
    let evs = events_of(&events);
    let levels: Vec<u64> = evs
        .iter()
        .filter(|e| e["type"] == "context_compacted")
        .filter_map(|e| e["level"].as_u64())
        .collect();
    assert_eq!(levels, [1, 2, 3], "{evs:#?}");
    assert!(!evs.iter().any(|e| e["type"] == "model_fallback"));
}

/// A model that answers "context length exceeded" once gets the turn again with a smaller
/// context (the `context_compacted` event, a shorter request), and the run succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_overflow_is_asked_again_compacted_and_the_run_succeeds() {
    let server = serve(vec![
        overflow(),
        answer(greet_call()),
        answer(final_output()),
    ])
    .await;
    // The tiny goal with a large state: 60 notes of 300 characters.
    let dir = tempfile::tempdir().expect("dir");
    let notes: Vec<String> = (0..60)
        .map(|i| format!("note {i}: {}", "lorem ipsum ".repeat(25)))
        .collect();
    let goal_arg = tiny_goal_with_state(dir.path(), json!({ "notes": notes }));
    let events = dir.path().join("events.jsonl");
    let (code, r, stderr) = run(&server, "openai:a", &["--no-store", &goal_arg], &events).await;
    assert_eq!(code, Some(0), "{r:#}\n{stderr}");
    assert_eq!(
        r["output"],
        json!({"name": "Ada", "greeting": "Hello, Ada!"})
    );
    let sizes: Vec<usize> = server
        .requests()
        .iter()
        .map(|q| q.body["messages"].to_string().len())
        .collect();
    assert_eq!(sizes.len(), 3);
    assert!(
        sizes[1] * 2 < sizes[0],
        "the compacted context is much smaller: {sizes:?}"
    );
    let evs = events_of(&events);
    let compacted: Vec<&Value> = evs
        .iter()
        .filter(|e| e["type"] == "context_compacted")
        .collect();
    assert_eq!(compacted.len(), 1, "{evs:#?}");
    assert_eq!(compacted[0]["step"], 1);
    assert_eq!(compacted[0]["level"], 1);
    assert!(compacted[0]["chars"].as_u64().is_some_and(|c| c > 0));
    let last = server.requests()[1].body["messages"].to_string();
    assert!(last.contains("The context was too long"), "{last}");
}

/// The tiny goal with `state` as its initial state, saved in `dir`; the `goal=` argument of
/// `run`.
fn tiny_goal_with_state(dir: &std::path::Path, state: Value) -> String {
    let mut goal: Value = serde_json::from_str(
        &std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(TINY))
            .expect("tiny goal"),
    )
    .expect("goal JSON");
    goal["state"] = state;
    let path = dir.join("big.goal.json");
    std::fs::write(&path, goal.to_string()).expect("write goal");
    format!("goal={}", path.display())
}

/// The tiny goal with a large state of many members (30 notes of about 600 characters, each
/// its own member, written in order), saved in `dir`.
fn long_goal(dir: &std::path::Path) -> String {
    let state: serde_json::Map<String, Value> = (0..30)
        .map(|i| {
            let note = format!("note {i}: {}", "lorem ipsum ".repeat(50));
            (format!("note{i:02}"), json!(note))
        })
        .collect();
    tiny_goal_with_state(dir, Value::Object(state))
}

/// The long goal (one greet call, then the output) against a server that refuses every
/// request longer than `limit` bytes with `refusal`; the run must succeed. Returns the server,
/// the sizes of the requests it received and the run's events.
async fn long_run_refused_past(
    limit: usize,
    refusal: Canned,
) -> (TestServer, Vec<usize>, Vec<Value>) {
    let server = serve_with_limit(
        vec![answer(greet_call()), answer(final_output())],
        Some((limit, refusal)),
    )
    .await;
    let dir = tempfile::tempdir().expect("dir");
    let goal_arg = long_goal(dir.path());
    let events = dir.path().join("events.jsonl");
    let (code, r, stderr) = run(&server, "openai:a", &["--no-store", &goal_arg], &events).await;
    assert_eq!(code, Some(0), "{r:#}\n{stderr}");
    assert_eq!(
        r["output"],
        json!({"name": "Ada", "greeting": "Hello, Ada!"})
    );
    let sizes: Vec<usize> = server
        .requests()
        .iter()
        .map(|q| dagloop_chars(&q.body))
        .collect();
    (server, sizes, events_of(&events))
}

/// A model whose window is smaller than the run's context: every request longer than the
/// limit is refused with "context length exceeded". Each turn is compacted step by step (level
/// 1 replaces the oldest notes, level 2 more of them under tighter caps) until it fits, and the
/// run succeeds; what reached the model always fit, and the oldest notes went first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_run_compacts_step_by_step_until_it_fits_and_succeeds() {
    const LIMIT: usize = 9_000;
    let (server, sizes, evs) = long_run_refused_past(LIMIT, overflow()).await;
    let compacted: Vec<(u64, u64)> = compactions(&evs)
        .into_iter()
        .map(|(step, level, _)| (step, level))
        .collect();
    assert_eq!(
        compacted,
        [(1, 1), (1, 2), (2, 1), (2, 2)],
        "each step needs two levels: {sizes:?}"
    );
    // Three requests a step: refused, refused (level 1), answered (level 2); each smaller.
    assert_eq!(sizes.len(), 6, "{sizes:?}");
    for step in sizes.chunks(3) {
        assert!(
            step[0] > LIMIT && step[1] > LIMIT && step[2] <= LIMIT,
            "{sizes:?}"
        );
        assert!(step[1] < step[0] && step[2] < step[1], "{sizes:?}");
    }
    // Level 1 replaced the oldest notes and kept the newest.
    let level1 = server.requests()[1].body["messages"].to_string();
    assert!(level1.contains("[not shown: "), "{level1}");
    assert!(
        level1.contains("†state.note00"),
        "the oldest note went first"
    );
    assert!(
        level1.contains("note 29: lorem"),
        "the newest note stays at level 1"
    );
}

/// After a step that made calls, the compacted context still shows each of them by its tool,
/// its status and its output path, and no longer its params (the brief of the step's calls,
/// made only once a context is compacted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_context_still_shows_the_last_steps_calls_in_brief() {
    let server = serve(vec![
        answer(greet_call()),
        overflow(),
        answer(final_output()),
    ])
    .await;
    let dir = tempfile::tempdir().expect("dir");
    let goal_arg = tiny_goal_with_state(dir.path(), json!({}));
    let events = dir.path().join("events.jsonl");
    let (code, r, stderr) = run(&server, "openai:a", &["--no-store", &goal_arg], &events).await;
    assert_eq!(code, Some(0), "{r:#}\n{stderr}");
    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    // The plan message of a request, as the model reads it.
    let plan = |i: usize| -> Value {
        let messages = requests[i].body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        messages
            .iter()
            .filter_map(|m| m["content"].as_str())
            .filter_map(|c| serde_json::from_str::<Value>(c).ok())
            .find(|v| v["type"] == "plan")
            .map(|v| v["plan"].clone())
            .unwrap_or(Value::Null)
    };
    assert_eq!(
        plan(1),
        json!([{"_tool": "greet", "name": "Ada", "_output": {"greeting": "Hello, Ada!"},
                "_outputPath": "†state.greeting", "_status": "done"}]),
        "the full context shows the call whole"
    );
    assert_eq!(
        plan(2),
        json!([{"_tool": "greet", "_outputPath": "†state.greeting", "_status": "done"}]),
        "the compacted context shows it in brief"
    );
}

/// The context_compacted events of a run: (step, level, refused_chars).
fn compactions(evs: &[Value]) -> Vec<(u64, u64, Value)> {
    evs.iter()
        .filter(|e| e["type"] == "context_compacted")
        .map(|e| {
            (
                e["step"].as_u64().unwrap_or(0),
                e["level"].as_u64().unwrap_or(0),
                e["refused_chars"].clone(),
            )
        })
        .collect()
}

/// A refusal that names the model's window (OpenAI's "maximum context length is 3000 tokens.
/// However, your messages resulted in N tokens") is met at once: the turn is asked again at
/// the least compaction level whose estimate fits (level 2 here, skipping level 1), and the
/// window is remembered, so the next step is compacted before it is asked (a
/// `context_compacted` event without `refused_chars`) and never refused. Only the first request
/// was too long, and the run succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_named_by_the_refusal_is_met_at_once_and_later_steps_compact_before_asking() {
    const LIMIT: usize = 9_000;
    let (_, sizes, evs) = long_run_refused_past(LIMIT, overflow_of(LIMIT / 3)).await;
    assert_eq!(sizes.len(), 3, "{sizes:?}");
    assert!(sizes[0] > LIMIT, "{sizes:?}");
    assert!(sizes[1..].iter().all(|s| *s <= LIMIT), "{sizes:?}");
    let refused = json!(sizes[0]);
    let compacted = compactions(&evs);
    assert_eq!(compacted.len(), 2, "{compacted:?}");
    assert_eq!((compacted[0].0, compacted[0].1), (1, 2), "{compacted:?}");
    assert!(
        compacted[0].2.as_u64().is_some_and(|c| c > 0),
        "{compacted:?} {refused}"
    );
    assert_eq!(compacted[1], (2, 2, Value::Null), "{compacted:?}");
}

/// A model entry that states its window (`openai:a#window=3000`) is met before any refusal:
/// each step whose context would not fit is compacted before it is asked (`context_compacted`
/// without `refused_chars`), so the server, which refuses anything past that window, never
/// refuses, and the run succeeds. The same window in the goal's own `model` list works alike,
/// and a replay of the stored run (the window read from its record) is identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_stated_in_the_model_list_is_met_before_any_refusal() {
    const LIMIT: usize = 9_000;
    for on_goal in [false, true] {
        let server = serve_with_limit(
            vec![answer(greet_call()), answer(final_output())],
            Some((LIMIT, overflow_of(LIMIT / 3))),
        )
        .await;
        let dir = tempfile::tempdir().expect("dir");
        let goal_arg = long_goal(dir.path());
        let spec = "openai:a#window=3000";
        let mut models = spec;
        if on_goal {
            let path = goal_arg.trim_start_matches("goal=");
            let mut goal: Value =
                serde_json::from_str(&std::fs::read_to_string(path).expect("goal")).expect("JSON");
            goal["model"] = json!([spec]);
            std::fs::write(path, goal.to_string()).expect("write goal");
            models = "";
        }
        let events = dir.path().join("events.jsonl");
        let store = dir.path().join("runs.db").display().to_string();
        let mut args = vec!["--store", store.as_str(), goal_arg.as_str()];
        let (code, r, stderr) = if on_goal {
            // No `--model`: the goal's list is the run's.
            let out = bin::dagloop_tokio()
                .args(["run", goal_arg.trim_start_matches("goal="), "--json"])
                .args(["--store", &store, "--events"])
                .arg(&events)
                .env("OPENAI_BASE_URL", server.openai_base())
                .env_remove("OPENAI_API_KEY")
                .output()
                .await
                .expect("run");
            let stdout = String::from_utf8_lossy(&out.stdout).to_string();
            let v: Value =
                serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
            (
                out.status.code(),
                v,
                String::from_utf8_lossy(&out.stderr).to_string(),
            )
        } else {
            args.truncate(3);
            run(&server, models, &args, &events).await
        };
        assert_eq!(code, Some(0), "{r:#}\n{stderr}");
        let sizes: Vec<usize> = server
            .requests()
            .iter()
            .map(|q| dagloop_chars(&q.body))
            .collect();
        assert_eq!(sizes.len(), 2, "never refused: {sizes:?}");
        assert!(sizes.iter().all(|s| *s <= LIMIT), "{sizes:?}");
        let compacted = compactions(&events_of(&events));
        assert!(!compacted.is_empty(), "compacted before asking");
        assert!(
            compacted.iter().all(|c| c.2.is_null()),
            "no refusal behind any compaction: {compacted:?}"
        );
        let listed = bin::dagloop()
            .args(["runs", "--json", "--store", &store])
            .output()
            .expect("runs");
        let listed: Value = serde_json::from_slice(&listed.stdout).expect("JSON");
        let id = listed[0]["id"].as_str().expect("id").to_string();
        let replayed = bin::dagloop()
            .args(["replay", &id, "--store", &store])
            .output()
            .expect("replay");
        let text = String::from_utf8_lossy(&replayed.stdout);
        assert!(text.contains("identical"), "{text}");
    }
}

/// When the window is known and even the most compacted context is estimated longer than it,
/// the run ends at once `run.context_overflow` (no request it knows to be refused is sent),
/// its error naming the window, the smallest context's size and the refused sizes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_whose_smallest_form_exceeds_the_window_ends_the_run_with_the_sizes() {
    let server =
        serve_with_limit(vec![answer(final_output())], Some((300, overflow_of(100)))).await;
    let dir = tempfile::tempdir().expect("dir");
    let events = dir.path().join("events.jsonl");
    let (code, r, stderr) = run(&server, "openai:a", &["--no-store"], &events).await;
    assert_eq!(code, Some(1), "{r:#}\n{stderr}");
    assert_eq!(r["error"]["code"], "run.context_overflow", "{r:#}");
    assert_eq!(
        server.requests().len(),
        1,
        "nothing sent past the first refusal"
    );
    let cause = &r["error"]["cause"];
    assert_eq!(cause["window_tokens"], 100, "{r:#}");
    let smallest = cause["smallest_tokens"].as_u64().unwrap_or(0);
    assert!(smallest > 100, "{r:#}");
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("window of 100 tokens") && message.contains(&smallest.to_string()),
        "{message}"
    );
    assert_eq!(cause["refused_chars"].as_array().map(Vec::len), Some(1));
    assert!(compactions(&events_of(&events)).is_empty());
}
