//! Workspace memory through the binary (docs/memory.md, spec/context.md): a goal's `memory`
//! folder is ranked for the goal when the run begins, the best chunks reach the model's request
//! under their sources, the chunks are recorded with the run (a replay with the folder deleted
//! is identical), `dagloop memory index|search` shows what a run gets, and a folder outside the
//! operator's file roots is refused.
#![cfg(feature = "server")]

#[path = "common/bin.rs"]
mod bin;
mod common;
#[path = "common/model_runs.rs"]
mod model_runs;

use std::path::Path;

use common::*;
use model_runs::*;
use serde_json::{Value, json};

/// Writes 200 Markdown notes into `dir/notes`: 198 about a warehouse's shipments, and two about
/// Ada (how she likes to be greeted, and who she was). Returns the folder.
fn notes(dir: &Path) -> std::path::PathBuf {
    let notes = dir.join("notes");
    std::fs::create_dir_all(notes.join("archive")).expect("notes");
    for i in 0..198 {
        let sub = if i % 2 == 0 { "archive/" } else { "" };
        std::fs::write(
            notes.join(format!("{sub}shipment-{i:03}.md")),
            format!(
                "# Shipment {i}\n\nThe warehouse shipped {i} crates of apples to the harbour.\n\n\
                 Invoice {i} was paid by the grocer on a rainy Tuesday.\n"
            ),
        )
        .expect("note");
    }
    std::fs::write(
        notes.join("ada-greeting.md"),
        "# Greeting Ada\n\nAda likes a greeting that calls her Countess Lovelace.\n",
    )
    .expect("note");
    std::fs::write(
        notes.join("ada-history.md"),
        "# Ada Lovelace\n\nAda wrote the first program for the Analytical Engine.\n",
    )
    .expect("note");
    notes
}

/// The tiny goal with `memory` set to `memory`, saved as `dir/goal.json`.
fn goal_with_memory(dir: &Path, memory: Value) -> std::path::PathBuf {
    let mut goal: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(TINY))
            .expect("tiny goal"),
    )
    .expect("goal JSON");
    goal["memory"] = memory;
    let path = dir.join("goal.json");
    std::fs::write(&path, goal.to_string()).expect("write goal");
    path
}

fn dagloop(store: &Path, args: &[&str]) -> (Option<i32>, Value) {
    let out = bin::dagloop()
        .env("DAGLOOP_STORE", store)
        .args(args)
        .output()
        .expect("dagloop");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), v)
}

/// Of 200 notes, the two about Ada reach the model's first request, each under its source, and
/// none of the others; the later request shows them too (searched again for the goal and what
/// the first step brought, they still rank first).
/// `dagloop memory search` lists the same two, `memory index` all 200 files. The run is
/// replayed identical with the folder deleted: the chunks were recorded with the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_goal_gets_the_two_relevant_chunks_and_a_replay_needs_no_folder() {
    let server = serve(vec![answer(greet_call()), answer(final_output())]).await;
    let dir = tempfile::tempdir().expect("dir");
    let folder = notes(dir.path());
    let goal = goal_with_memory(dir.path(), json!({"path": "notes"}));
    let store = dir.path().join("runs.db");
    let events = dir.path().join("events.jsonl");
    let goal_arg = format!("goal={}", goal.display());
    let store_arg = store.display().to_string();
    let (code, r, stderr) = run(
        &server,
        "openai:a",
        &["--store", &store_arg, &goal_arg],
        &events,
    )
    .await;
    assert_eq!(code, Some(0), "{r:#}\n{stderr}");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    for q in &requests {
        let memory = memory_text(&q.body);
        assert!(
            memory.contains("[ada-greeting.md:1]\n# Greeting Ada")
                && memory.contains("Countess Lovelace"),
            "{memory}"
        );
        assert!(
            memory.contains("[ada-history.md:1]\n# Ada Lovelace")
                && memory.contains("Analytical Engine"),
            "{memory}"
        );
        assert!(!memory.contains("shipment-"), "{memory}");
        assert!(!memory.contains("warehouse"), "{memory}");
    }

    // What authors see: the same two chunks, and the whole folder indexed.
    let (code, found) = dagloop(
        &store,
        &["memory", "search", &goal.display().to_string(), "--json"],
    );
    assert_eq!(code, Some(0), "{found:#}");
    let sources: Vec<&str> = found["chunks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["source"].as_str())
        .collect();
    assert_eq!(sources.len(), 2, "{found:#}");
    assert!(sources.contains(&"ada-greeting.md") && sources.contains(&"ada-history.md"));
    let (code, index) = dagloop(
        &store,
        &["memory", "index", &goal.display().to_string(), "--json"],
    );
    assert_eq!(code, Some(0), "{index:#}");
    let files: std::collections::BTreeSet<&str> = index["chunks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["source"].as_str())
        .collect();
    assert_eq!(files.len(), 200, "{index:#}");
    assert!(files.contains("archive/shipment-000.md"));

    // The folder is gone: the replay shows the recorded chunks and is identical.
    std::fs::remove_dir_all(&folder).expect("remove notes");
    let (_, listed) = dagloop(&store, &["runs", "--json"]);
    let id = listed[0]["id"].as_str().expect("id").to_string();
    let (code, replayed) = dagloop(&store, &["replay", &id]);
    assert_eq!(code, Some(0), "{replayed:#}");
    assert_eq!(replayed["status"], "identical", "{replayed:#}");
}

/// Memory is searched before each step, for the goal and what the step before brought: the
/// first step's call writes about the observatory's telescope, so the second request shows the
/// note about the telescope (which the first did not) beside the two about Ada. The chunks of
/// each step are journaled: with the folder deleted, the replay is identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_step_gets_the_chunks_for_what_the_step_before_brought() {
    let server = serve(vec![telescope_answer(), answer(final_output())]).await;
    let dir = tempfile::tempdir().expect("dir");
    let folder = notes(dir.path());
    std::fs::write(folder.join("telescope.md"), TELESCOPE_NOTE).expect("note");
    let goal = goal_with_memory(dir.path(), json!({"path": "notes"}));
    let store = dir.path().join("runs.db");
    let events = dir.path().join("events.jsonl");
    let goal_arg = format!("goal={}", goal.display());
    let store_arg = store.display().to_string();
    let (code, r, stderr) = run(
        &server,
        "openai:a",
        &["--store", &store_arg, &goal_arg],
        &events,
    )
    .await;
    assert_eq!(code, Some(0), "{r:#}\n{stderr}");
    let requests = server.requests();
    assert_each_step_recalls_what_the_step_before_brought(&requests);
    let second = memory_text(&requests[1].body);
    assert!(second.contains("[ada-greeting.md:1]"), "{second}");
    assert!(!second.contains("shipment-"), "{second}");

    std::fs::remove_dir_all(&folder).expect("remove notes");
    let (_, listed) = dagloop(&store, &["runs", "--json"]);
    let id = listed[0]["id"].as_str().expect("id").to_string();
    let (code, replayed) = dagloop(&store, &["replay", &id]);
    assert_eq!(code, Some(0), "{replayed:#}");
    assert_eq!(replayed["status"], "identical", "{replayed:#}");
    // What each step got is in the journal, under its step.
    use dagloop::store::{RunStore, SqliteStore};
    let stored = SqliteStore::open(&store)
        .expect("store")
        .load(&id)
        .expect("run");
    let journal = serde_json::to_value(&stored.journal).expect("journal");
    let recalled: Vec<(u64, Vec<String>)> = journal
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["input"] == "recalled")
        .map(|e| {
            let sources = e["chunks"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["source"].as_str().map(str::to_string))
                .collect();
            (e["step"].as_u64().unwrap_or(0), sources)
        })
        .collect();
    assert_eq!(recalled.len(), 2, "{recalled:?}");
    assert_eq!((recalled[0].0, recalled[1].0), (1, 2));
    assert!(!recalled[0].1.contains(&"telescope.md".to_string()));
    assert!(recalled[1].1.contains(&"telescope.md".to_string()));
}

/// A memory folder outside the operator's granted file roots is refused before the run starts
/// (`grant.file`, pointing at `/memory/path`), whether or not it exists; the model is never
/// asked. `dagloop memory search` is held to the same grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_folder_outside_the_file_roots_is_refused() {
    let server = serve(vec![answer(final_output())]).await;
    let dir = tempfile::tempdir().expect("dir");
    let allowed = dir.path().join("allowed");
    std::fs::create_dir_all(&allowed).expect("allowed");
    notes(dir.path());
    let config = dir.path().join("config.json");
    std::fs::write(
        &config,
        json!({"grants": {"files": [allowed.display().to_string()]}}).to_string(),
    )
    .expect("config");
    let config = config.display().to_string();
    for path in ["../notes", "../missing"] {
        let goal = goal_with_memory(&allowed, json!({"path": path}));
        let out = bin::dagloop()
            .args(["--config", &config, "run"])
            .arg(&goal)
            .args(["--json", "--no-store", "--model", "openai:a"])
            .env("OPENAI_BASE_URL", server.openai_base())
            .output()
            .expect("run");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
        assert_ne!(out.status.code(), Some(0), "{v:#}");
        let text = v.to_string();
        assert!(text.contains("\"grant.file\""), "{v:#}");
        assert!(text.contains("/memory/path"), "{v:#}");
        let out = bin::dagloop()
            .args(["--config", &config, "memory", "search"])
            .arg(&goal)
            .output()
            .expect("memory search");
        assert_ne!(out.status.code(), Some(0));
        assert!(String::from_utf8_lossy(&out.stdout).contains("grant.file"));
    }
    assert_eq!(server.requests().len(), 0, "the model is never asked");
    // Inside the roots, the same folder is read.
    let inside = allowed.join("notes");
    std::fs::rename(dir.path().join("notes"), &inside).expect("move notes");
    let goal = goal_with_memory(&allowed, json!({"path": "notes", "top": 1}));
    let out = bin::dagloop()
        .args(["--config", &config, "memory", "search"])
        .arg(&goal)
        .args(["Who wrote the first program?", "--json"])
        .output()
        .expect("memory search");
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["chunks"][0]["source"], "ada-history.md", "{v:#}");
    assert_eq!(v["chunks"].as_array().map(Vec::len), Some(1), "{v:#}");
}

/// The operator's config may name a memory folder (`memory.path`, relative to the config's
/// folder) for goals that name none: a goal without `memory` run under that config gets the
/// relevant chunks, and `dagloop memory search` shows them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_memory_serves_goals_that_name_none() {
    let done = json!({"calls": [], "output": {"name": "Ada", "greeting": "Hello, Countess!"}});
    let server = serve(vec![answer(done)]).await;
    let dir = tempfile::tempdir().expect("dir");
    notes(dir.path());
    let config = dir.path().join("config.json");
    std::fs::write(
        &config,
        json!({"memory": {"path": "notes", "top": 1}}).to_string(),
    )
    .expect("config");
    let config = config.display().to_string();
    let events = dir.path().join("events.jsonl");
    let (code, r, stderr) = run(
        &server,
        "openai:a",
        &["--no-store", "--config", &config],
        &events,
    )
    .await;
    assert_eq!(code, Some(0), "{r:#}\n{stderr}");
    let memory = memory_text(&server.requests()[0].body);
    assert!(memory.contains("[ada-"), "{memory}");
    assert_eq!(memory.matches("\n[").count(), 1, "top 1: {memory}");
    let out = bin::dagloop()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["--config", &config, "memory", "search", TINY, "--json"])
        .output()
        .expect("memory search");
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["chunks"].as_array().map(Vec::len), Some(1), "{v:#}");
}

/// Memory is part of what compaction may drop: refused three times (a refusal naming no
/// window), the turn is asked at levels 1 and 2 with the memory chunks and at level 3, the most
/// compacted, without them (spec/context.md C4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_most_compacted_context_leaves_the_memory_out() {
    let done = json!({"calls": [], "output": {"name": "Ada", "greeting": "Hello, Countess!"}});
    let server = serve(vec![overflow(), overflow(), overflow(), answer(done)]).await;
    let dir = tempfile::tempdir().expect("dir");
    notes(dir.path());
    let goal = goal_with_memory(dir.path(), json!({"path": "notes"}));
    let goal_arg = format!("goal={}", goal.display());
    let events = dir.path().join("events.jsonl");
    let (code, r, stderr) = run(&server, "openai:a", &["--no-store", &goal_arg], &events).await;
    assert_eq!(code, Some(0), "{r:#}\n{stderr}");
    let shown: Vec<bool> = server
        .requests()
        .iter()
        .map(|q| memory_text(&q.body).contains("Countess Lovelace"))
        .collect();
    assert_eq!(shown, [true, true, true, false], "levels 0 to 3");
}

/// A run resumed after its memory folder was deleted searches nothing for the steps it had not
/// asked yet, and says so: the step's journaled `recalled` entry carries a note naming the
/// folder. (The process is killed while step 2's model request hangs; the resumed run asks
/// step 2 again with the chunks it journaled, then step 3 finds the folder gone.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_run_whose_folder_is_gone_notes_it_in_the_journal() {
    let call = |path: &str| {
        json!({"calls": [{"_tool": "greet", "name": "Ada",
            "_output": {"greeting": "Hello Ada"}, "_outputPath": path}], "output": null})
    };
    let first = serve(vec![
        answer(call("†state.greeting")),
        Canned::pieces(vec![Piece::Hang]),
    ])
    .await;
    let dir = tempfile::tempdir().expect("dir");
    let folder = notes(dir.path());
    let goal = goal_with_memory(dir.path(), json!({"path": "notes"}));
    let store = dir.path().join("runs.db");
    let mut child = bin::dagloop()
        .env("DAGLOOP_STORE", &store)
        .env("DAGLOOP_LEASE_MS", "200")
        .env("OPENAI_BASE_URL", first.openai_base())
        .env_remove("OPENAI_API_KEY")
        .args([
            "run",
            &goal.display().to_string(),
            "--json",
            "--model",
            "openai:a",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("dagloop run");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while first.hits() < 2 {
        assert!(std::time::Instant::now() < deadline, "step 2 never asked");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    child.kill().expect("kill");
    let _ = child.wait();
    tokio::time::sleep(std::time::Duration::from_millis(400)).await; // the lease runs out
    std::fs::remove_dir_all(&folder).expect("remove notes");

    let second = serve(vec![answer(call("†state.again")), answer(final_output())]).await;
    let (_, listed) = dagloop(&store, &["runs", "--json"]);
    let id = listed[0]["id"].as_str().expect("id").to_string();
    let out = bin::dagloop()
        .env("DAGLOOP_STORE", &store)
        .env("OPENAI_BASE_URL", second.openai_base())
        .env_remove("OPENAI_API_KEY")
        .args(["resume", &id, "--json"])
        .output()
        .expect("resume");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    use dagloop::store::{RunStore, SqliteStore};
    let stored = SqliteStore::open(&store)
        .expect("store")
        .load(&id)
        .expect("run");
    let journal = serde_json::to_value(&stored.journal).expect("journal");
    let recalled: Vec<&Value> = journal
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["input"] == "recalled")
        .collect();
    let step = |n: u64| recalled.iter().find(|e| e["step"] == n).copied();
    let two = step(2).expect("step 2 recalled");
    assert!(two.get("note").is_none(), "{two}");
    assert!(
        two["chunks"].as_array().is_some_and(|c| !c.is_empty()),
        "{two}"
    );
    let three = step(3).expect("step 3 recalled");
    assert!(three.get("chunks").is_none(), "{three}");
    let note = three["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("memory folder `notes`") && note.contains("resumed"),
        "{three}"
    );
}
