//! Issue 12: goal files of the published shape with hostile values (huge, negative and NaN-like
//! numbers, long and unicode strings, wrong types) never make the real binary panic. `dagloop
//! validate` and `dagloop run --model scripted:...` exit 0, 1 or 2, print JSON on stdout, and
//! carry a stable `code` when they exit 2.

#[path = "common/bin.rs"]
mod bin;

use proptest::prelude::*;
use serde_json::{Value, json};

fn hostile_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(-1)),
        Just(json!(-5.5)),
        Just(json!(0)),
        Just(json!(1e300)),
        Just(json!(-1e300)),
        Just(json!(1.7976931348623157e308)),
        Just(json!(u64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(5e-324)),
        Just(json!("NaN")),
        Just(json!("inf")),
        Just(json!(null)),
        Just(json!(true)),
        Just(json!([1])),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        (0u32..100).prop_map(|n| json!(n)),
    ]
}

fn hostile_string() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("†state.".to_string()),
        Just("${HOME}".to_string()),
        Just("{id}".to_string()),
        Just("\u{0}\u{202e}é😀".to_string()),
        "\\PC{0,40}",
        (1usize..5000).prop_map(|n| "x".repeat(n)),
    ]
}

fn hostile_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        hostile_number(),
        hostile_string().prop_map(Value::String),
        Just(json!({})),
        Just(json!({"type": "nonsense"})),
    ]
}

/// Mostly the valid value, sometimes a hostile one, so that one bad field at a time reaches
/// the code behind the first check.
fn mostly(valid: Value, hostile: impl Strategy<Value = Value> + 'static) -> BoxedStrategy<Value> {
    prop_oneof![3 => Just(valid), 1 => hostile].boxed()
}

fn tool() -> impl Strategy<Value = Value> {
    (
        prop_oneof![4 => Just("lookup".to_string()), 1 => hostile_string()],
        mostly(
            json!("http"),
            prop_oneof![Just(json!("htpp")), Just(json!("shell")), hostile_value()],
        ),
        mostly(json!("http://127.0.0.1:9/{id}"), hostile_value()),
        mostly(json!(2), hostile_number()),
        mostly(json!(1024), hostile_number()),
    )
        .prop_map(|(name, activity, url, timeout, max_bytes)| {
            json!({"_tool": name, "type": "object", "_activity": activity,
                   "_http": {"url": url, "timeout_s": timeout, "max_bytes": max_bytes}})
        })
}

fn goal() -> impl Strategy<Value = Value> {
    (
        prop_oneof![4 => Just("Answer.".to_string()), 1 => hostile_string()],
        (
            mostly(json!(60), hostile_number()),
            mostly(json!(5), hostile_number()),
            mostly(json!(3), hostile_number()),
            mostly(json!(100000), hostile_number()),
        ),
        (mostly(json!(30), hostile_number()), mostly(json!("reject"), hostile_value())),
        mostly(json!({"type": "object"}), hostile_value()),
        proptest::collection::vec(tool(), 0..2),
    )
        .prop_map(|(text, (t, ct, steps, budget), (at, decision), output_schema, tools)| {
            json!({
                "goal": text,
                "output_schema": output_schema,
                "limits": {"timeout_s": t, "call_timeout_s": ct, "max_steps": steps, "token_budget": budget},
                "approval": {"policy": "ask", "timeout_s": at, "default_decision": decision},
                "tools": tools,
            })
        })
}

fn check(args: &[&str]) -> Result<(), TestCaseError> {
    let out = bin::dagloop()
        .args(args)
        .env_remove("HOME")
        .output()
        .map_err(|e| TestCaseError::fail(format!("start: {e}")))?;
    let code = out.status.code();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    prop_assert!(
        matches!(code, Some(0..=2)),
        "{args:?} exited {code:?}\nstdout: {stdout}\nstderr: {stderr}"
    );
    prop_assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    let v: Value = serde_json::from_str(&stdout)
        .map_err(|e| TestCaseError::fail(format!("{args:?}: not JSON ({e}): {stdout}")))?;
    if code == Some(2) {
        let c = v["error"]["code"].as_str().unwrap_or("");
        prop_assert!(
            c.contains('.')
                && c.chars()
                    .all(|ch| ch.is_ascii_lowercase() || ch == '.' || ch == '_'),
            "{args:?}: unstable code {c:?} in {v:#}"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn hostile_goals_never_panic(goal in goal()) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("goal.json");
        std::fs::write(&path, goal.to_string()).unwrap();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/e2e/scripts/answer.script.json");
        let model = format!("scripted:{script}");
        let p = path.to_str().unwrap();
        check(&["validate", p])?;
        check(&["run", p, "--json", "--model", &model, "--approve", "auto"])?;
    }
}
