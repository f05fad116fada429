//! Helpers for tests that run a goal through the binary against an OpenAI-compatible canned
//! server (`common::serve`): the canned answers, the run itself, and its events file.
#![allow(dead_code)]

use crate::bin;
use crate::common::*;
use serde_json::{Value, json};

pub const TINY: &str = "tests/fixtures/real_model/tiny.goal.json";

/// A 503 the client may retry at once (`Retry-After: 0`), so the test waits for no backoff.
pub fn unavailable() -> Canned {
    Canned::status(503, r#"{"error": {"message": "upstream overloaded"}}"#)
        .header("retry-after", "0")
}

pub fn answer(solution: Value) -> Canned {
    Canned::sse(&oa_stream(&solution.to_string()))
}

pub fn greet_call() -> Value {
    json!({"calls": [{"_tool": "greet", "name": "Ada", "_output": {"greeting": "Hello, Ada!"},
                      "_outputPath": "†state.greeting"}], "output": null})
}

pub fn final_output() -> Value {
    json!({"calls": [], "output": {"name": "Ada", "greeting": "†state.greeting.greeting"}})
}

pub fn events_of(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

pub async fn run(
    server: &TestServer,
    models: &str,
    extra: &[&str],
    events: &std::path::Path,
) -> (Option<i32>, Value, String) {
    let goal = extra
        .iter()
        .find_map(|a| a.strip_prefix("goal="))
        .unwrap_or(TINY)
        .to_string();
    let extra: Vec<&str> = extra
        .iter()
        .copied()
        .filter(|a| !a.starts_with("goal="))
        .collect();
    let out = bin::dagloop_tokio()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["run", &goal, "--json", "--model", models])
        .args(extra)
        .arg("--events")
        .arg(events)
        .env("OPENAI_BASE_URL", server.openai_base())
        .env_remove("OPENAI_API_KEY")
        .output()
        .await
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let v = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}{stderr}"));
    (out.status.code(), v, stderr)
}

/// A "too long" refusal that names no window (the llama.cpp server's): the run compacts one
/// level further per refusal.
pub fn overflow() -> Canned {
    Canned::status(
        400,
        r#"{"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it", "type": "exceed_context_size_error"}}"#,
    )
}

/// OpenAI's refusal, naming a window of `tokens` and the request's tokens (filled in by
/// `serve_with_limit`: its bytes / 3).
pub fn overflow_of(tokens: usize) -> Canned {
    let body = json!({"error": {
        "message": format!("This model's maximum context length is {tokens} tokens. However, your messages resulted in {{request_tokens}} tokens. Please reduce the length of the messages."),
        "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}});
    Canned::status(400, &body.to_string())
}

/// A streamed answer that stops after its first `keep` characters of `solution`'s text: the
/// connection drops mid-answer (after content arrived).
pub fn broken(solution: &Value, keep: usize) -> Canned {
    let text = solution.to_string();
    let head: String = text.chars().take(keep).collect();
    let mut c = Canned::sse(&[
        oa_delta(json!({"role": "assistant", "content": ""})),
        oa_text(&head),
    ]);
    // Let the content reach the client before the drop.
    c.pieces
        .push(Piece::Sleep(std::time::Duration::from_millis(200)));
    c.pieces.push(Piece::Break);
    c
}

/// A whole (`stream: false`) chat-completions answer with `solution` as its text.
pub fn whole(solution: &Value) -> Canned {
    let body = json!({
        "id": "c2", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": solution.to_string()}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
    });
    Canned::status(200, &body.to_string())
}

/// The requests' `stream` flags and model names, in order.
pub fn asked(server: &TestServer) -> Vec<(Value, Value)> {
    server
        .requests()
        .iter()
        .map(|q| (q.body["stream"].clone(), q.body["model"].clone()))
        .collect()
}

/// The memory message of a model request, as the model reads it (empty when there is none).
pub fn memory_text(body: &Value) -> String {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["content"].as_str())
        .find(|c| c.starts_with("Workspace memory"))
        .unwrap_or_default()
        .to_string()
}

/// A first answer whose call writes about the observatory's telescope: what a second step's
/// memory search is then asked about ([`TELESCOPE_NOTE`]).
pub fn telescope_answer() -> Canned {
    answer(json!({"calls": [{"_tool": "greet", "name": "Ada",
        "_output": {"greeting": "Hello Ada, the observatory telescope awaits you"},
        "_outputPath": "†state.greeting"}], "output": null}))
}

/// The note only the second step's search finds (after [`telescope_answer`]).
pub const TELESCOPE_NOTE: &str =
    "# The telescope\n\nThe observatory's telescope is pointed at Saturn on clear nights.\n";

/// Memory searched per step: the first request shows the note about Ada and nothing of the
/// telescope; the second, searched for what the first step's call wrote, shows the telescope.
pub fn assert_each_step_recalls_what_the_step_before_brought(requests: &[Recorded]) {
    assert_eq!(requests.len(), 2);
    let (first, second) = (
        memory_text(&requests[0].body),
        memory_text(&requests[1].body),
    );
    assert!(first.contains("[ada-greeting.md:1]"), "{first}");
    assert!(
        !first.contains("telescope"),
        "step 1 knows nothing of it: {first}"
    );
    assert!(
        second.contains("[telescope.md:1]\n# The telescope") && second.contains("Saturn"),
        "step 2 searched for what step 1 wrote: {second}"
    );
}
