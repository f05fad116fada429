//! A run has one definition (`runs::define`): what it was built from is recorded with it, and a
//! run whose definition changed while it waited is not silently continued under another one.

#[path = "common/bin.rs"]
mod bin;

use std::path::Path;

use serde_json::Value;

fn copy_example(to: &Path) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/delegate");
    for f in [
        "goal.json",
        "support.script.json",
        "translator.goal.json",
        "translator.script.json",
    ] {
        std::fs::copy(from.join(f), to.join(f)).expect("copy");
    }
}

fn json_of(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&out.stdout)))
}

/// The delegate example started with every call asked and detached: its id, and a decisions
/// file that approves the call it waits on.
fn waiting_run(dir: &Path, store: &Path) -> (String, std::path::PathBuf) {
    let out = bin::dagloop()
        .current_dir(dir)
        .arg("--store")
        .arg(store)
        .args(["run", "goal.json", "--approve", "ask", "--detach", "--json"])
        .output()
        .expect("run");
    let v = json_of(&out);
    assert_eq!(v["status"], "waiting", "{v}");
    let approve = dir.join("approve.json");
    std::fs::write(
        &approve,
        r#"{"decisions": [{"tool": "translateReply", "decision": "approve"}]}"#,
    )
    .expect("decisions");
    (v["run_id"].as_str().expect("run id").to_string(), approve)
}

#[test]
fn a_changed_delegate_goal_stops_resume_until_the_change_is_accepted() {
    let dir = tempfile::tempdir().expect("tmp");
    copy_example(dir.path());
    let store = dir.path().join("runs.db");
    let (id, approve) = waiting_run(dir.path(), &store);

    // The delegate's goal is edited while the run waits.
    let translator = dir.path().join("translator.goal.json");
    let mut g: Value =
        serde_json::from_str(&std::fs::read_to_string(&translator).expect("read")).expect("JSON");
    g["goal"] = Value::String(format!("{} Be brief.", g["goal"].as_str().unwrap_or("")));
    std::fs::write(&translator, g.to_string()).expect("write");

    let resume = |extra: &[&str]| {
        bin::dagloop()
            .current_dir(dir.path())
            .arg("--store")
            .arg(&store)
            .args(["resume", &id, "--json", "--decisions"])
            .arg(&approve)
            .args(extra)
            .output()
            .expect("resume")
    };
    let out = resume(&[]);
    assert_eq!(out.status.code(), Some(2));
    let v = json_of(&out);
    assert_eq!(v["error"]["code"], "run.definition_changed", "{v}");
    let message = v["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("delegate /tools/1/_delegate"), "{message}");
    assert!(
        !message.contains("goal,"),
        "only the delegate changed: {message}"
    );

    // Accepted, the run goes on under the new definition, which is recorded.
    let out = resume(&["--accept-changes"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(json_of(&out)["status"], "succeeded");
}

#[test]
fn an_unchanged_definition_resumes_without_asking() {
    let dir = tempfile::tempdir().expect("tmp");
    copy_example(dir.path());
    let store = dir.path().join("runs.db");
    let (id, approve) = waiting_run(dir.path(), &store);
    let out = bin::dagloop()
        .current_dir(dir.path())
        .arg("--store")
        .arg(&store)
        .args(["resume", &id, "--json", "--decisions"])
        .arg(&approve)
        .output()
        .expect("resume");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
