//! The command line's model set-up, through the binary: a missing OpenAI key is refused before
//! anything starts, unless a base URL points at a local server (which needs none); `--mode` and
//! the goal's `mode` choose what `dagloop schema` prints.

#[path = "common/bin.rs"]
mod bin;

use std::process::Command;

use serde_json::Value;

const TINY: &str = "tests/fixtures/real_model/tiny.goal.json";

fn dagloop(args: &[&str]) -> Command {
    let mut cmd = bin::dagloop();
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL");
    cmd
}

fn json_of(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn a_missing_openai_key_without_a_base_url_is_refused_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let out = dagloop(&[
        "run",
        TINY,
        "--model",
        "openai:gpt-4o-mini",
        "--json",
        "--events",
    ])
    .arg(&events)
    .output()
    .unwrap();
    let v = json_of(&out);
    assert_eq!(out.status.code(), Some(2), "{v}");
    assert_eq!(v["status"], "error");
    assert_eq!(v["error"]["code"], "llm.missing_api_key");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("OPENAI_API_KEY"), "{message}");
    assert!(message.contains("OPENAI_BASE_URL"), "{message}");
    // Nothing started: no events file.
    assert!(!events.exists());
    // An empty key counts as missing.
    let out = dagloop(&["run", TINY, "--model", "openai:gpt-4o-mini", "--json"])
        .env("OPENAI_API_KEY", "")
        .output()
        .unwrap();
    assert_eq!(json_of(&out)["error"]["code"], "llm.missing_api_key");
}

#[test]
fn a_local_server_needs_no_key() {
    // A base URL and no key: the run starts, and fails on the (closed) server, not on the key.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = dagloop(&["run", TINY, "--model", "openai:local", "--json"])
        .env("OPENAI_BASE_URL", format!("http://127.0.0.1:{port}/v1"))
        .output()
        .unwrap();
    let v = json_of(&out);
    assert_eq!(out.status.code(), Some(1), "{v}");
    assert_eq!(v["error"]["cause"]["code"], "llm.transport", "{v}");
}

#[test]
fn schema_prints_what_each_mode_sends() {
    let out = dagloop(&["schema", TINY]).output().unwrap();
    assert!(out.status.success());
    let structured = json_of(&out);
    assert_eq!(
        structured["required"],
        serde_json::json!(["calls", "output"])
    );
    let greet = &structured["properties"]["calls"]["items"]["anyOf"][0];
    assert_eq!(greet["properties"]["_tool"]["const"], "greet");

    let out = dagloop(&["schema", TINY, "--mode", "tools"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let tools = json_of(&out);
    let names: Vec<&str> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["greet", "final_output"]);
    // The same branch as structured mode, without `_tool`: params accept references, and the
    // latent tool's `_output` is required.
    let params = &tools[0]["parameters"];
    assert!(params["properties"].get("_tool").is_none());
    assert_eq!(params["properties"]["name"], greet["properties"]["name"]);
    assert_eq!(params["required"], serde_json::json!(["name", "_output"]));
    let v = jsonschema::validator_for(params).unwrap();
    assert!(v.is_valid(&serde_json::json!({"name": "†input.name", "_output": {"greeting": "Hi"}})));
    assert!(!v.is_valid(&serde_json::json!({"name": 3, "_output": {"greeting": "Hi"}})));
    assert_eq!(
        tools[1]["parameters"]["properties"]["output"],
        structured["properties"]["output"]["anyOf"][0]
    );

    // A goal's own `mode` is the default; `--mode` overrides it.
    let dir = tempfile::tempdir().unwrap();
    let mut goal: Value = serde_json::from_str(&std::fs::read_to_string(TINY).unwrap()).unwrap();
    goal["mode"] = "tools".into();
    let path = dir.path().join("goal.json");
    std::fs::write(&path, goal.to_string()).unwrap();
    let path = path.to_str().unwrap();
    let out = dagloop(&["schema", path]).output().unwrap();
    assert!(json_of(&out).is_array());
    let out = dagloop(&["schema", path, "--mode", "structured"])
        .output()
        .unwrap();
    assert!(json_of(&out).is_object());
    goal["mode"] = "native".into();
    std::fs::write(dir.path().join("bad.json"), goal.to_string()).unwrap();
    let out = dagloop(&["schema", dir.path().join("bad.json").to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json_of(&out)["error"]["code"], "goal.invalid");
}
