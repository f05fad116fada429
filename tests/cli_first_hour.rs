//! Issue 49's small frictions, through the real binary: a detached run says what to do next,
//! `dagloop runs` lines its columns up (with the step each run is at), and `dagloop show` of a run
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
    for heading in ["STATUS", "STEP", "AGE", "WAITING", "TITLE"] {
        let at = lines[0].find(heading).expect("heading");
        let end = at + heading.len();
        for row in &lines[1..3] {
            let right_aligned = matches!(heading, "STEP" | "AGE" | "WAITING");
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
    // The table is the contract: the columns after the run id (which varies in length), ages
    // masked.
    let status_at = lines[0].find("STATUS").expect("STATUS");
    let (age_at, age_end) = (
        lines[0].find("  AGE").expect("AGE"),
        lines[0].find("AGE").expect("AGE") + 3,
    );
    let masked: Vec<String> = lines
        .iter()
        .map(|l| {
            let label = if l.starts_with("RUN ") {
                "RUN"
            } else if l.starts_with(id) {
                "<waiting run>"
            } else {
                "<finished run>"
            };
            let rest: String = l
                .char_indices()
                .skip(status_at)
                .map(|(i, c)| {
                    if (age_at..age_end).contains(&i) && c.is_ascii_digit() {
                        '#'
                    } else {
                        c
                    }
                })
                .collect();
            format!("{label:<16}{rest}")
        })
        .collect();
    insta::assert_snapshot!("runs_list", masked.join("\n"));

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

/// `dagloop CWD --store DB ARGS...` run in `cwd`: exit code and stdout.
fn dagloop_in(cwd: &Path, db: &Path, args: &[&str]) -> (i32, String) {
    let out = bin::dagloop()
        .current_dir(cwd)
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

/// A run started with a script named relative to one directory and resumed from another keeps
/// its model's usage under one name (before, the model was named by the path it was loaded
/// from, `scripted:s.json` then `scripted:/abs/s.json`, and `show` split the usage in two).
#[test]
fn a_run_resumed_from_another_directory_keeps_one_models_usage_under_one_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (start, elsewhere) = (dir.path().join("start"), dir.path().join("elsewhere"));
    std::fs::create_dir_all(&start).expect("dir");
    std::fs::create_dir_all(&elsewhere).expect("dir");
    let db = dir.path().join("runs.db");
    std::fs::write(
        start.join("goal.json"),
        serde_json::json!({
            "goal": "Echo a word, then answer with it.",
            "output_schema": {"type": "object", "required": ["said"]},
            "tools": [{"_tool": "echo", "_activity": "shell", "_shell": {"command": ["echo", "{word}"]},
                       "type": "object", "properties": {"word": {"type": "string"}},
                       "required": ["word"]}]
        })
        .to_string(),
    )
    .expect("goal");
    std::fs::write(
        start.join("s.json"),
        serde_json::json!({"turns": [
            {"solution": {"calls": [{"_tool": "echo", "word": "hi", "_outputPath": "†state.said"}],
                          "output": null}},
            {"solution": {"calls": [], "output": {"said": "†state.said"}}}
        ]})
        .to_string(),
    )
    .expect("script");
    let (code, out) = dagloop_in(
        &start,
        &db,
        &[
            "run",
            "goal.json",
            "--model",
            "scripted:s.json",
            "--approve",
            "ask",
            "--allow-shell",
            "--detach",
        ],
    );
    assert_eq!(code, 0, "{out}");
    let v: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["status"], "waiting", "{v:#}");
    let id = v["run_id"].as_str().expect("id").to_string();
    let (code, out) = dagloop_in(&elsewhere, &db, &["decide", &id, "c1", "approve"]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = dagloop_in(&elsewhere, &db, &["resume", &id, "--allow-shell"]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = dagloop_in(&elsewhere, &db, &["show", &id, "--json"]);
    assert_eq!(code, 0, "{out}");
    let shown: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(shown["status"], "succeeded", "{shown:#}");
    let usage = &shown["usage"];
    assert!(usage["output_tokens"].as_u64() > Some(0), "{usage:#}");
    // One model answered both turns: one name, so no per-model split at all.
    assert!(
        usage
            .get("models")
            .is_none_or(|m| m.as_object().is_some_and(|m| m.len() == 1)),
        "{usage:#}"
    );
}
