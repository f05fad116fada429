//! Issue 12: hostile numbers never panic, `validate` refuses what `run` refuses, scripted-model
//! files are checked, and usage errors are JSON with `--json`. Everything goes through the real
//! binary, run from `tests/fixtures/e2e/hostile` so messages do not depend on where the
//! repository lives.

#[path = "common/bin.rs"]
mod bin;

use serde_json::Value;

/// Runs `dagloop ARGS` from the fixture folder: (exit code, stdout as JSON).
fn dagloop(args: &[&str]) -> (i32, Value) {
    let out = bin::dagloop()
        .args(args)
        .current_dir(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/e2e/hostile"
        ))
        .env_remove("DAGLOOP_TEST_UNSET_VAR")
        .output()
        .expect("start dagloop");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?}: stdout is not JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), v)
}

fn message(v: &Value) -> &str {
    v["error"]["message"].as_str().unwrap_or("")
}

#[test]
fn out_of_range_seconds_are_goal_invalid_naming_the_field() {
    for (goal, field) in [
        ("negative_timeout.goal.json", "limits.timeout_s must be"),
        ("huge_timeout.goal.json", "limits.timeout_s must be"),
        (
            "negative_call_timeout.goal.json",
            "limits.call_timeout_s must be",
        ),
        (
            "huge_approval_timeout.goal.json",
            "approval.timeout_s must be",
        ),
    ] {
        for args in [vec!["run", goal, "--json"], vec!["validate", goal]] {
            let (code, v) = dagloop(&args);
            assert_eq!(code, 2, "{args:?}: {v:#}");
            assert_eq!(v["error"]["code"], "goal.invalid", "{args:?}: {v:#}");
            assert!(message(&v).contains(field), "{args:?}: {v:#}");
            assert!(message(&v).len() < 300, "a short message: {v:#}");
        }
    }
}

#[test]
fn validate_refuses_tools_and_models_the_run_cannot_use() {
    // Either the goal does not load at all (exit 2, `goal.invalid`: the published schema or the
    // activity's own config parser refuses it), or it loads and a finding names the problem.
    for (goal, code, text) in [
        (
            "activity_typo.goal.json",
            "tool.activity",
            "unknown `_activity` `htpp`",
        ),
        ("http_without_url.goal.json", "goal.invalid", "url"),
        ("http_unknown_key.goal.json", "goal.invalid", "header"),
        ("shell_unknown_key.goal.json", "goal.invalid", "cwd"),
        (
            "delegate_missing.goal.json",
            "tool.activity",
            "nowhere.goal.json",
        ),
        (
            "script_missing.goal.json",
            "model.script",
            "nowhere.script.json",
        ),
        ("script_malformed.goal.json", "model.script", "chunk_chars"),
    ] {
        let (exit, v) = dagloop(&["validate", goal]);
        let (found, said) = if exit == 2 {
            (&v["error"]["code"], &v["error"]["message"])
        } else {
            assert_eq!(
                (exit, &v["status"]),
                (1, &Value::from("invalid")),
                "{goal}: {v:#}"
            );
            (&v["findings"][0]["code"], &v["findings"][0]["message"])
        };
        assert_eq!(found, code, "{goal}: {v:#}");
        assert!(
            said.as_str().is_some_and(|m| m.contains(text)),
            "{goal}: {v:#}"
        );
    }
}

#[test]
fn the_activity_check_refuses_what_the_activity_refuses() {
    // The same function validate uses, on tools built directly (no goal schema in front of it).
    use dagloop::protocol::Tool;
    let tool = |v: Value| Tool::from_value(v).expect("tool");
    let dir = std::path::Path::new(".");
    let e = dagloop::tools::check_tool(
        &tool(serde_json::json!({"_tool": "a", "_activity": "htpp"})),
        dir,
    )
    .expect_err("unknown kind");
    assert_eq!(e.code(), "activity.unknown_kind");
    assert!(e.to_string().contains("unknown `_activity` `htpp`"), "{e}");
    for (t, text) in [
        (
            serde_json::json!({"_tool": "a", "_activity": "http", "_http": {"method": "GET"}}),
            "missing field `url`",
        ),
        (
            serde_json::json!({"_tool": "a", "_activity": "http", "_http": {"url": "http://x", "header": {}}}),
            "unknown field `header`",
        ),
        (
            serde_json::json!({"_tool": "a", "_activity": "http", "_http": {"url": "http://x", "timeout_s": 1e300}}),
            "_http.timeout_s must be",
        ),
        (
            serde_json::json!({"_tool": "a", "_activity": "http", "_http": {"url": "http://x", "body": "form"}}),
            "unknown body mode",
        ),
        (
            serde_json::json!({"_tool": "a", "_activity": "shell", "_shell": {"command": ["ls"], "cwd": "/"}}),
            "unknown field `cwd`",
        ),
        (
            serde_json::json!({"_tool": "a", "_http": {"url": "http://x"}}),
            "`_activity` is not set",
        ),
        (
            serde_json::json!({"_tool": "a", "_delegate": 3}),
            "`_delegate` must be a goal file path",
        ),
    ] {
        let e = dagloop::tools::check_tool(&tool(t.clone()), dir).expect_err(&t.to_string());
        assert_eq!(e.code(), "activity.config", "{t}");
        assert!(e.to_string().contains(text), "{t}: {e}");
    }
    // The goal file a delegate names is read by the goal's loaders, not the activity check
    // (`validate` reports a missing one: `validate_refuses_tools_and_models_the_run_cannot_use`).
    for ok in [
        serde_json::json!({"_tool": "a", "_delegate": "nowhere.goal.json"}),
        serde_json::json!({"_tool": "a"}),
        serde_json::json!({"_tool": "a", "_activity": "rust"}),
        serde_json::json!({"_tool": "a", "_activity": "http", "_http": {"url": "http://x/{id}", "method": "get", "body": "query", "timeout_s": 2, "max_bytes": 10}}),
    ] {
        dagloop::tools::check_tool(&tool(ok.clone()), dir).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
}

#[test]
fn validate_checks_a_scripted_model_file() {
    let (exit, v) = dagloop(&["validate", "../scripts/answer.script.json"]);
    assert_eq!((exit, &v["status"]), (0, &Value::from("valid")), "{v:#}");
    assert_eq!(v["kind"], "scripted-model");

    let (exit, v) = dagloop(&[
        "validate",
        "calls_unknown.script.json",
        "--goal",
        "one_tool.goal.json",
    ]);
    assert_eq!(exit, 1, "{v:#}");
    assert_eq!(v["findings"][0]["code"], "script.unknown_tool", "{v:#}");
    assert_eq!(
        v["findings"][0]["turn"], 1,
        "turns are numbered from 1: {v:#}"
    );
    assert_eq!(
        v["findings"][0]["call"], 2,
        "calls are numbered from 1: {v:#}"
    );

    let (exit, v) = dagloop(&["validate", "bad_solution.script.json"]);
    assert_eq!(exit, 1, "{v:#}");
    assert_eq!(v["findings"][0]["code"], "script.invalid_solution", "{v:#}");
}

#[test]
fn env_placeholders_must_be_listed_and_set_before_the_run() {
    let (code, v) = dagloop(&["run", "env_unlisted.goal.json", "--json"]);
    assert_eq!(
        (code, &v["error"]["code"]),
        (2, &Value::from("goal.invalid")),
        "{v:#}"
    );
    assert!(
        message(&v).contains("not listed in the goal's `env`"),
        "{v:#}"
    );
    let (code, v) = dagloop(&["run", "env_unset.goal.json", "--json"]);
    assert_eq!(
        (code, &v["error"]["code"]),
        (2, &Value::from("goal.invalid")),
        "{v:#}"
    );
    assert!(message(&v).contains("is not set"), "{v:#}");
}

#[test]
fn usage_errors_are_json_with_json() {
    for args in [
        vec!["run", "--json"],
        vec!["run", "x.goal.json", "--json", "--approve", "sometimes"],
        vec!["frobnicate", "--json"],
    ] {
        let (code, v) = dagloop(&args);
        assert_eq!(code, 2, "{args:?}: {v:#}");
        assert_eq!(v["status"], "error", "{args:?}: {v:#}");
        assert_eq!(v["error"]["code"], "cli.usage", "{args:?}: {v:#}");
        assert!(!message(&v).is_empty(), "{v:#}");
    }
    let out = bin::dagloop().args(["run"]).output().expect("start");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        out.stdout.is_empty(),
        "without --json clap prints usage on stderr"
    );
}
