//! Issue 49's small frictions, through the real binary: a detached run says what to do next,
//! `dagloop runs` lines its columns up, and `dagloop show` of a run
//! waiting for a reviewer prints no `decided -` for calls nobody was asked about and no empty
//! critical-path heading.

#[path = "common/bin.rs"]
mod bin;

use std::path::Path;

use serde_json::Value;

/// `dagloop --store DB ARGS...`: exit code and stdout.
fn dagloop(db: &Path, args: &[&str]) -> (i32, String) {
    let out = bin::dagloop()
        .arg("--store")
        .arg(db)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run dagloop");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
    )
}

#[test]
fn a_detached_run_says_what_next_and_runs_and_show_line_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("runs.db");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let goal = root.join("examples/first-goal/goal.json");
    let tools = root.join("examples/first-goal/tools.json");
    let (code, out) = dagloop(
        &db,
        &[
            "run",
            goal.to_str().expect("path"),
            "--tools-from",
            tools.to_str().expect("path"),
            "--approve",
            "ask",
            "--detach",
        ],
    );
    assert_eq!(code, 0, "{out}");
    let v: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["status"], "waiting", "{v:#}");
    let id = v["run_id"].as_str().expect("id");
    let first = v["awaiting"][0]["call_id"]
        .as_u64()
        .expect("a waiting call");
    assert_eq!(
        v["next"],
        serde_json::json!([
            format!("dagloop show {id}"),
            format!("dagloop decide {id} {first} approve"),
            format!("dagloop resume {id}"),
        ]),
        "{v:#}"
    );

    // A second, finished run, so the list has rows of different widths.
    let (code, _) = dagloop(
        &db,
        &[
            "run",
            goal.to_str().expect("path"),
            "--tools-from",
            tools.to_str().expect("path"),
            "--json",
        ],
    );
    assert_eq!(code, 0);
    let (code, list) = dagloop(&db, &["runs"]);
    assert_eq!(code, 0, "{list}");
    let lines: Vec<&str> = list.lines().collect();
    assert!(lines[0].starts_with("RUN "), "{list}");
    // Every column starts where its heading does.
    for heading in ["STATUS", "AGE", "WAITING", "TITLE"] {
        let at = lines[0].find(heading).expect("heading");
        let end = at + heading.len();
        for row in &lines[1..3] {
            let right_aligned = matches!(heading, "AGE" | "WAITING");
            let cell = if right_aligned { end - 1 } else { at };
            assert!(
                row.as_bytes().get(cell).is_some_and(|b| *b != b' '),
                "{heading}: {list}"
            );
            assert!(
                right_aligned || row.as_bytes().get(at - 1) == Some(&b' '),
                "{heading}: {list}"
            );
        }
    }
    let waiting = lines
        .iter()
        .find(|l| l.starts_with(id))
        .expect("the waiting run");
    assert!(waiting.contains("waiting"), "{list}");
    assert!(lines.iter().any(|l| l.contains("succeeded")), "{list}");

    let (code, shown) = dagloop(&db, &["show", id]);
    assert_eq!(code, 0, "{shown}");
    assert!(shown.contains("received"), "{shown}");
    assert!(!shown.contains("decided      -"), "{shown}");
    assert!(!shown.contains("decided -"), "{shown}");
    assert!(!shown.contains("critical path"), "{shown}");
}

/// A script whose output does not match the schema, and then runs out: the run ends with
/// `run.model_error` (`llm.script_exhausted`), and its `error.cause.output_errors` says why no
/// output was accepted (before, the validation errors were only on stderr).
#[test]
fn a_run_that_never_got_a_valid_output_says_why_in_its_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("goal.json"),
        serde_json::json!({
            "goal": "Answer with a number.",
            "model": "scripted:script.json",
            "output_schema": {"type": "object", "required": ["answer"],
                              "properties": {"answer": {"type": "integer"}}},
            "tools": []
        })
        .to_string(),
    )
    .expect("goal");
    std::fs::write(
        dir.path().join("script.json"),
        serde_json::json!({"turns": [
            {"solution": {"calls": [], "output": {"answer": "forty-two"}}}
        ]})
        .to_string(),
    )
    .expect("script");
    let goal = dir.path().join("goal.json");
    let (code, out) = dagloop(
        &dir.path().join("runs.db"),
        &["run", goal.to_str().expect("path"), "--json"],
    );
    assert_eq!(code, 1, "{out}");
    let r: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(r["error"]["code"], "run.model_error", "{r:#}");
    assert_eq!(r["error"]["cause"]["code"], "llm.script_exhausted", "{r:#}");
    let errors = r["error"]["cause"]["output_errors"].to_string();
    assert!(errors.contains("answer"), "{r:#}");
    assert!(errors.contains("integer"), "{r:#}");
}
