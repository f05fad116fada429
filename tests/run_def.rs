//! A run has one definition (`runs::define`): what it was built from is recorded with it, and a
//! stored run goes on under that record (a delegate goal file edited while it waited is not
//! read again) until its driver is told to accept the changes.

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

/// The delegate goal the stored run recorded (by the pointer of its `_delegate`).
fn recorded_delegate(store: &Path, id: &str) -> Value {
    let c = rusqlite::Connection::open(store).expect("open");
    let record: String = c
        .query_row("SELECT record FROM runs WHERE id = ?1", [id], |r| r.get(0))
        .expect("row");
    let record: Value = serde_json::from_str(&record).expect("JSON");
    record["options"]["record"]["delegates"]["/tools/1/_delegate"]["goal"].clone()
}

#[test]
fn a_stored_run_keeps_its_delegate_goal_until_a_change_is_accepted() {
    let dir = tempfile::tempdir().expect("tmp");
    copy_example(dir.path());
    let store = dir.path().join("runs.db");
    let (id, approve) = waiting_run(dir.path(), &store);
    let before = recorded_delegate(&store, &id);
    assert!(
        before["goal"].is_string(),
        "recorded at the start: {before}"
    );

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
    // Without --accept-changes the run goes on as it was defined: the file is not read again.
    let out = resume(&["--detach"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(recorded_delegate(&store, &id), before);

    // A second waiting run, resumed with --accept-changes, takes the edited file and records it.
    let (id2, approve) = waiting_run(dir.path(), &store);
    let out = bin::dagloop()
        .current_dir(dir.path())
        .arg("--store")
        .arg(&store)
        .args(["resume", &id2, "--json", "--accept-changes", "--decisions"])
        .arg(&approve)
        .output()
        .expect("resume");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(json_of(&out)["status"], "succeeded");
    let after = recorded_delegate(&store, &id2);
    assert!(
        after["goal"].as_str().unwrap_or("").ends_with("Be brief."),
        "{after}"
    );
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
