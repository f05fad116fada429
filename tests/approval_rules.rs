//! Approval rules (spec/approval.md R1-R4): a table of calls × policies with the decision and
//! the deciding rule, the old forms as shorthand, and rule examples checked when a goal loads
//! (through the binary: `dagloop validate` and `dagloop policy explain`).

#[path = "common/bin.rs"]
mod bin;

use dagloop::approval::{Policy, RuleDecision, evaluate};
use dagloop::protocol::{Call, Tool, ToolApproval};
use serde_json::{Value, json};

fn tool(name: &str, approval: Option<ToolApproval>, annotations: Option<Value>) -> Tool {
    let mut t = Tool::new(name);
    t.activity = Some("http".into());
    t.approval = approval;
    if let Some(a) = annotations {
        t.schema.insert("annotations".into(), a);
    }
    t
}

fn call(v: Value) -> Call {
    Call::try_from(v).expect("call")
}

fn policy(v: Value) -> Policy {
    Policy::from_value(&v).expect("policy")
}

/// Rules first (first match wins), then the tool's `_approval`, then the mode.
#[test]
fn calls_times_rules_give_the_expected_decision() {
    let rules = policy(json!({"policy": "ask", "rules": [
        {"name": "no-big-refunds", "tool": "refund", "decision": "deny",
         "when": {"properties": {"amount": {"minimum": 1000}}, "required": ["amount"]},
         "reason": "refunds of 1000 or more go through finance"},
        {"name": "small-refunds", "tool": "refund", "decision": "allow",
         "when": {"properties": {"amount": {"maximum": 50}}, "required": ["amount"]}},
        {"name": "read-only-mcp", "tool": "*", "decision": "allow",
         "when": {"properties": {"_annotations": {"properties": {"readOnlyHint": {"const": true}},
                                                   "required": ["readOnlyHint"]}}}},
        {"name": "destructive", "tool": "*", "decision": "ask",
         "when": {"properties": {"_annotations": {"properties": {"destructiveHint": {"const": true}},
                                                   "required": ["destructiveHint"]}}}},
        {"tool": "fs_*", "decision": "allow"}
    ]}));
    let refund = tool("refund", None, None);
    let read = tool("docs_search", None, Some(json!({"readOnlyHint": true})));
    let wipe = tool("fs_wipe", None, Some(json!({"destructiveHint": true})));
    let list = tool("fs_list", None, None);
    let never = tool("ping", Some(ToolApproval::Never), None);
    let other = tool("email", None, None);
    let table: Vec<(&Tool, Value, RuleDecision, &str)> = vec![
        (
            &refund,
            json!({"_tool": "refund", "amount": 5000}),
            RuleDecision::Deny,
            "no-big-refunds",
        ),
        (
            &refund,
            json!({"_tool": "refund", "amount": 20}),
            RuleDecision::Allow,
            "small-refunds",
        ),
        (
            &refund,
            json!({"_tool": "refund", "amount": 200}),
            RuleDecision::Ask,
            "policy:ask",
        ),
        (
            &read,
            json!({"_tool": "docs_search", "q": "x"}),
            RuleDecision::Allow,
            "read-only-mcp",
        ),
        // First match wins: `destructive` comes before `fs_*`.
        (
            &wipe,
            json!({"_tool": "fs_wipe", "path": "/"}),
            RuleDecision::Ask,
            "destructive",
        ),
        (
            &list,
            json!({"_tool": "fs_list", "path": "/"}),
            RuleDecision::Allow,
            "rules[4]",
        ),
        (
            &never,
            json!({"_tool": "ping"}),
            RuleDecision::Allow,
            "_approval",
        ),
        (
            &other,
            json!({"_tool": "email", "to": "a@b"}),
            RuleDecision::Ask,
            "policy:ask",
        ),
    ];
    for (t, c, decision, rule) in table {
        let c = call(c);
        let v = evaluate(t, &c, &rules);
        assert_eq!(
            (v.decision, v.label(&rules).as_str()),
            (decision, rule),
            "{c:?}"
        );
    }
}

/// The old forms are shorthand: with no rules they decide as before (rule 14).
#[test]
fn the_old_forms_decide_as_before() {
    let plain = tool("refund", None, None);
    let always = tool("wire", Some(ToolApproval::Always), None);
    let never = tool("read", Some(ToolApproval::Never), None);
    let c = |t: &Tool| call(json!({"_tool": t.name}));
    let table = [
        (json!({"policy": "auto"}), &plain, RuleDecision::Allow),
        (json!({"policy": "ask"}), &plain, RuleDecision::Ask),
        (
            json!({"policy": "allowlist", "allow": ["refund"]}),
            &plain,
            RuleDecision::Allow,
        ),
        (
            json!({"policy": "allowlist", "allow": ["x"]}),
            &plain,
            RuleDecision::Ask,
        ),
        (json!({"policy": "auto"}), &always, RuleDecision::Ask),
        (json!({"policy": "ask"}), &never, RuleDecision::Allow),
    ];
    for (p, t, d) in table {
        let p = policy(p);
        assert_eq!(evaluate(t, &c(t), &p).decision, d, "{p:?} {}", t.name);
    }
}

/// Examples are checked when the policy is read: the error names the rule and the example.
#[test]
fn rule_examples_are_checked_when_the_policy_is_read() {
    let ok = json!({"rules": [{"name": "small", "tool": "refund", "decision": "allow",
        "when": {"properties": {"amount": {"maximum": 50}}},
        "examples": {"match": [{"amount": 10}], "not_match": [{"amount": 500}, {"_tool": "other"}]}}]});
    assert!(Policy::from_value(&ok).is_ok());
    let wrong = json!({"rules": [{"tool": "x"}, {"name": "small", "tool": "refund", "decision": "allow",
        "when": {"properties": {"amount": {"maximum": 50}}},
        "examples": {"match": [{"amount": 10}, {"amount": 60}]}}]});
    // (the first rule lacks `decision`: malformed)
    assert_eq!(
        Policy::from_value(&wrong).expect_err("malformed").code(),
        "approval.malformed"
    );
    let wrong = json!({"rules": [{"name": "small", "tool": "refund", "decision": "allow",
        "when": {"properties": {"amount": {"maximum": 50}}},
        "examples": {"match": [{"amount": 10}, {"amount": 60}]}}]});
    let e = Policy::from_value(&wrong).expect_err("a failing example");
    assert_eq!(e.code(), "approval.rule_example");
    assert!(
        e.to_string().contains("small") && e.to_string().contains("examples.match[1]"),
        "{e}"
    );
    let glob_without_tool = json!({"rules": [{"tool": "fs_*", "decision": "allow",
        "examples": {"match": [{"path": "/"}]}}]});
    let e = Policy::from_value(&glob_without_tool).expect_err("no _tool");
    assert_eq!(e.code(), "approval.bad_rule");
    assert!(e.to_string().contains("rules[0]"), "{e}");
    let bad_schema = json!({"rules": [{"tool": "a", "decision": "deny", "when": {"type": 12}}]});
    assert_eq!(
        Policy::from_value(&bad_schema)
            .expect_err("bad when")
            .code(),
        "approval.bad_rule"
    );
}

fn write_goal(dir: &std::path::Path, approval: Value) -> std::path::PathBuf {
    let goal = json!({"goal": "g", "output_schema": {"type": "object"},
        "tools": [{"_tool": "refund", "_activity": "http", "_http": {"method": "POST", "url": "http://127.0.0.1:9/r"},
                   "type": "object", "properties": {"amount": {"type": "number"}}}],
        "approval": approval});
    let p = dir.join("goal.json");
    std::fs::write(&p, goal.to_string()).expect("goal");
    p
}

/// Through the binary: a goal whose rule example fails is refused at load with the code and the
/// rule; `policy explain` names the deciding rule and the rules passed over.
#[test]
fn the_binary_refuses_failing_examples_and_explains_decisions() {
    let dir = tempfile::tempdir().expect("dir");
    let bad = write_goal(
        dir.path(),
        json!({"rules": [{"name": "small", "tool": "refund", "decision": "allow",
            "when": {"properties": {"amount": {"maximum": 50}}},
            "examples": {"not_match": [{"amount": 5}]}}]}),
    );
    let out = bin::dagloop()
        .args(["policy", "explain"])
        .arg(&bad)
        .args(["--call", r#"{"_tool": "refund", "amount": 5}"#])
        .output()
        .expect("explain");
    // Errors are printed as `{"status": "error", "error": {"code", "message"}}`.
    let err = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success());
    assert!(
        err.contains("approval.rule_example")
            && err.contains("small")
            && err.contains("examples.not_match[0]"),
        "{err}"
    );
    let good = write_goal(
        dir.path(),
        json!({"policy": "ask", "rules": [
            {"name": "huge", "tool": "refund", "decision": "deny", "when": {"properties": {"amount": {"minimum": 1000}}}},
            {"name": "small", "tool": "refund", "decision": "allow", "when": {"properties": {"amount": {"maximum": 50}}}}
        ]}),
    );
    let explain = |c: &str| {
        let out = bin::dagloop()
            .args(["policy", "explain"])
            .arg(&good)
            .args(["--call", c, "--json"])
            .output()
            .expect("explain");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).expect("json")
    };
    let v = explain(r#"{"_tool": "refund", "amount": 20}"#);
    assert_eq!(
        (v["decision"].as_str(), v["rule"].as_str()),
        (Some("allow"), Some("small")),
        "{v}"
    );
    assert_eq!(v["skipped"][0]["rule"], "huge", "{v}");
    let v = explain(r#"{"_tool": "refund", "amount": 200}"#);
    assert_eq!(
        (v["decision"].as_str(), v["rule"].as_str()),
        (Some("ask"), Some("policy:ask")),
        "{v}"
    );
    assert_eq!(v["skipped"].as_array().map(Vec::len), Some(2), "{v}");
}
