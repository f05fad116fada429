//! Retention and compaction of finished runs (issue 25, "bounded storage"), through the
//! binary: `runs prune --retain` deletes exactly the finished runs older than the limit and
//! never a waiting or stopped one; a compacted run's `show`, `show --audit` and `GET /runs/{id}`
//! answer as before while `replay`, `fork` and cassettes refuse it with `store.compacted`;
//! bad ages are refused with their code; `dagloop serve` applies the config's `[store]` policy
//! at start.

#[path = "common/bin.rs"]
mod bin;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};

const DAY_MS: i64 = 86_400_000;

/// `dagloop --store STORE` with a fixed reviewer name (the audit names who decided).
fn cmd(store: &Path) -> Command {
    let mut c = bin::dagloop();
    c.arg("--store").arg(store).env("USER", "reviewer");
    c
}

fn out_of(args: &[&str], store: &Path) -> Output {
    cmd(store).args(args).output().expect("dagloop")
}

fn json_out(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|_| {
        panic!(
            "not JSON: {}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

fn text(o: &Output) -> String {
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The output of every run of [`write_goal`].
fn greeted() -> Value {
    json!({"greeting": "Hello Ada\n"})
}

/// A goal whose model asks for one `greet` call (a shell command; a reviewer decides it), then
/// outputs what it printed.
fn write_goal(dir: &Path) -> PathBuf {
    let script = json!({"turns": [
        {"solution": {"calls": [{"_tool": "greet", "name": "Ada", "_outputPath": "†state.g"}], "output": null}},
        {"solution": {"calls": [], "output": {"greeting": "†state.g.stdout"}}}
    ]});
    std::fs::write(dir.join("s.json"), script.to_string()).expect("script");
    let greet = json!({"_tool": "greet", "_activity": "shell", "_shell": {"command": ["echo", "Hello Ada"]},
        "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]});
    let goal = json!({"goal": "Greet Ada\nthen say so", "model": "scripted:s.json",
        "output_schema": {"type": "object", "required": ["greeting"]}, "tools": [greet],
        "approval": {"policy": "ask"}});
    let path = dir.join("goal.json");
    std::fs::write(&path, goal.to_string()).expect("goal");
    path
}

/// A run left waiting for its reviewer (`run --detach`); its id.
fn waiting_run(store: &Path, goal: &Path) -> String {
    let v = json_out(
        &cmd(store)
            .arg("run")
            .arg(goal)
            .args(["--json", "--detach", "--allow-shell"])
            .output()
            .expect("run"),
    );
    assert_eq!(v["status"], "waiting", "{v}");
    v["run_id"].as_str().expect("id").to_string()
}

/// A run decided from another process (`decide`), then finished by `resume`; its id.
fn finished_run(store: &Path, goal: &Path) -> String {
    let id = waiting_run(store, goal);
    text(&out_of(&["decide", &id, "1", "approve"], store));
    let done = json_out(&out_of(&["resume", &id, "--json", "--detach"], store));
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["output"], greeted());
    id
}

/// A run whose process was killed mid-run, its lease expired: `stopped`.
fn stopped_run(store: &Path, goal: &Path) -> String {
    let o = cmd(store)
        .arg("run")
        .arg(goal)
        .args(["--json", "--detach", "--allow-shell"])
        .env("DAGLOOP_CRASH_AFTER_ENTRIES", "1")
        .env("DAGLOOP_LEASE_MS", "100")
        .output()
        .expect("run");
    assert!(!o.status.success(), "the run was to be killed");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let listed = json_out(&out_of(&["runs", "--json", "--status", "stopped"], store));
    listed[0]["id"].as_str().expect("a stopped run").to_string()
}

/// Makes a run look `days` old (its last update), as time would.
fn age(store: &Path, id: &str, days: i64) {
    let c = rusqlite::Connection::open(store).expect("sql");
    let then = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64
        - days * DAY_MS;
    let n = c
        .execute(
            "UPDATE runs SET updated_at = ?2, created_at = min(created_at, ?2) WHERE id = ?1",
            rusqlite::params![id, then],
        )
        .expect("age");
    assert_eq!(n, 1);
}

fn statuses(store: &Path) -> Vec<(String, String)> {
    let listed = json_out(&out_of(&["runs", "--json", "--limit", "500"], store));
    let mut v: Vec<(String, String)> = listed
        .as_array()
        .expect("array")
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap_or("").to_string(),
                r["status"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

fn code(o: &Output) -> (Option<i32>, Value) {
    (o.status.code(), json_out(o)["error"]["code"].clone())
}

#[test]
fn retention_deletes_exactly_the_finished_runs_older_than_the_limit() {
    let dir = tempfile::tempdir().expect("dir");
    let store = dir.path().join("runs.db");
    let goal = write_goal(dir.path());
    let old = finished_run(&store, &goal);
    let fresh = finished_run(&store, &goal);
    let waiting = waiting_run(&store, &goal);
    let stopped = stopped_run(&store, &goal);
    for id in [&old, &waiting, &stopped] {
        age(&store, id, 40);
    }
    age(&store, &fresh, 29);
    let before = statuses(&store);
    assert_eq!(before.len(), 4, "{before:?}");

    // Bad ages and no policy at all are refused, and nothing is touched.
    for bad in [
        "30",
        "30x",
        "-1d",
        "1.5d",
        "",
        "soon",
        "99999999999999999999d",
    ] {
        let o = out_of(&["runs", "prune", &format!("--retain={bad}")], &store);
        assert_eq!(code(&o), (Some(2), json!("cli.bad_duration")), "{bad}");
        let o = out_of(
            &["runs", "prune", &format!("--compact-after={bad}")],
            &store,
        );
        assert_eq!(code(&o), (Some(2), json!("cli.bad_duration")), "{bad}");
    }
    let o = out_of(&["runs", "prune"], &store);
    assert_eq!(code(&o), (Some(2), json!("runs.no_retention")));
    let config = dir.path().join("bad.json");
    std::fs::write(&config, r#"{"store": {"retain": "soon"}}"#).expect("config");
    let o = cmd(&store)
        .arg("--config")
        .arg(&config)
        .args(["runs", "prune"])
        .output()
        .expect("prune");
    assert_eq!(code(&o), (Some(2), json!("config.invalid")));
    assert_eq!(statuses(&store), before);

    // The config's policy, applied once from the command line.
    let config = dir.path().join("keep.toml");
    std::fs::write(&config, "[store]\nretain = \"30d\"\n").expect("config");
    let done = json_out(
        &cmd(&store)
            .arg("--config")
            .arg(&config)
            .args(["runs", "prune"])
            .output()
            .expect("prune"),
    );
    assert_eq!(done["status"], "pruned", "{done}");
    assert_eq!(done["deleted"], 1, "{done}");
    assert_eq!(done["compacted"], 0, "{done}");
    let mut want = vec![
        (fresh.clone(), "succeeded".to_string()),
        (waiting.clone(), "waiting".to_string()),
        (stopped.clone(), "stopped".to_string()),
    ];
    want.sort();
    assert_eq!(statuses(&store), want);
    let gone = out_of(&["show", &old], &store);
    assert_eq!(code(&gone).1, "store.unknown_run");

    // Whatever the age, a run that is not finished stays whole, and stays decidable.
    let done = json_out(&out_of(
        &["runs", "prune", "--retain", "0s", "--compact-after", "0s"],
        &store,
    ));
    assert_eq!(
        (done["deleted"].clone(), done["compacted"].clone()),
        (json!(1), json!(0)),
        "{done}"
    );
    let mut want = vec![
        (waiting.clone(), "waiting".to_string()),
        (stopped.clone(), "stopped".to_string()),
    ];
    want.sort();
    assert_eq!(statuses(&store), want);
    let o = out_of(&["runs", "compact", &waiting], &store);
    assert_eq!(code(&o), (Some(2), json!("store.not_finished")));
    text(&out_of(&["decide", &waiting, "1", "approve"], &store));
    let done = json_out(&out_of(&["resume", &waiting, "--json", "--detach"], &store));
    assert_eq!(done["status"], "succeeded", "{done}");
    let o = out_of(&["resume", &stopped, "--json", "--detach"], &store);
    assert_eq!(json_out(&o)["status"], "waiting", "the stopped run goes on");
}

/// The audit as JSON, with the times and sequence numbers that differ from run to run zeroed.
fn stable_audit(v: &Value) -> Value {
    let mut v = v.clone();
    for e in v["audit"].as_array_mut().into_iter().flatten() {
        for k in ["at", "seq", "asked_at"] {
            if e.get(k).is_some() {
                e[k] = json!(0);
            }
        }
    }
    v["run_id"] = json!("RUN");
    v
}

#[test]
fn a_compacted_run_shows_as_before_and_refuses_what_needs_its_journal() {
    let dir = tempfile::tempdir().expect("dir");
    let store = dir.path().join("runs.db");
    let goal = write_goal(dir.path());
    let id = finished_run(&store, &goal);
    let waiting = waiting_run(&store, &goal);
    let views: Vec<Vec<&str>> = vec![
        vec!["show", &id],
        vec!["show", &id, "--json"],
        vec!["show", &id, "--audit"],
        vec!["show", &id, "--audit", "--json"],
        vec!["show", &id, "--trace", "--json"],
    ];
    let before: Vec<String> = views.iter().map(|a| text(&out_of(a, &store))).collect();
    let replayed = json_out(&out_of(&["replay", &id], &store));
    assert_eq!(
        replayed["status"], "identical",
        "replayable before: {replayed}"
    );

    let done = json_out(&out_of(&["runs", "compact", &id], &store));
    assert_eq!(done["status"], "compacted", "{done}");
    let c = &done["runs"][0];
    assert_eq!(c["run_id"], json!(id));
    assert_eq!(c["already"], false);
    assert!(c["journal_bytes_dropped"].as_u64() > Some(0), "{done}");
    assert!(c["entries"].as_u64() > Some(3), "{done}");

    // `show`, its JSON, the audit and the trace answer exactly as before.
    for (args, was) in views.iter().zip(&before) {
        assert_eq!(&text(&out_of(args, &store)), was, "{args:?}");
    }
    let audit = json_out(&out_of(&["show", &id, "--audit", "--json"], &store));
    assert_eq!(audit["audit"][0]["principal"], "reviewer", "{audit}");
    insta::assert_json_snapshot!("compacted_audit", stable_audit(&audit));
    let shown = text(&out_of(&["show", &id], &store));
    assert!(shown.contains("(approve by reviewer, cli)"), "{shown}");

    // What needs the journal refuses with the code, naming what was dropped.
    let cassette = dir.path().join("cassette");
    for args in [
        vec!["replay", &id],
        vec!["fork", &id, "--at-step", "0", "--json"],
        vec![
            "export",
            &id,
            "--cassette",
            cassette.to_str().expect("path"),
        ],
    ] {
        let o = out_of(&args, &store);
        let v = json_out(&o);
        assert_eq!(v["error"]["code"], "store.compacted", "{args:?}: {v}");
        assert_ne!(o.status.code(), Some(0));
        let msg = v["error"]["message"].as_str().unwrap_or("");
        assert!(msg.contains("journal") && msg.contains("dropped"), "{msg}");
    }
    // It is finished: resume prints its result, a decision is refused as for any finished run.
    let r = json_out(&out_of(&["resume", &id, "--json"], &store));
    assert_eq!(
        (r["status"].clone(), r["output"].clone()),
        (json!("succeeded"), greeted())
    );
    let o = out_of(&["decide", &id, "1", "approve"], &store);
    assert_eq!(json_out(&o)["error"]["code"], "op.run_finished");
    // Compacting again changes nothing; the store says what compaction saved.
    let again = json_out(&out_of(&["runs", "compact", &id], &store));
    assert_eq!(again["runs"][0]["already"], true, "{again}");
    let stats = json_out(&out_of(&["runs", "--stats"], &store));
    assert_eq!(stats["compacted_runs"], 1, "{stats}");
    assert_eq!(
        stats["compacted_journal_bytes"], c["journal_bytes_dropped"],
        "{stats}"
    );
    assert!(
        stats["compacted_snapshot_bytes"].as_u64() > Some(0),
        "{stats}"
    );
    // The listing is unchanged by compaction.
    assert!(statuses(&store).contains(&(id.clone(), "succeeded".into())));
    assert!(statuses(&store).contains(&(waiting, "waiting".into())));
}

#[path = "common/serve.rs"]
mod serve;

#[tokio::test]
async fn serve_applies_the_configs_retention_at_start_and_serves_compacted_runs() {
    let dir = tempfile::tempdir().expect("dir");
    let store = dir.path().join("runs.db");
    let goal = write_goal(dir.path());
    let old = finished_run(&store, &goal);
    let kept = finished_run(&store, &goal);
    let waiting = waiting_run(&store, &goal);
    age(&store, &old, 10);
    age(&store, &waiting, 10);
    age(&store, &kept, 2);
    let shown = json_out(&out_of(&["show", &kept, "--json"], &store));
    let audit = json_out(&out_of(&["show", &kept, "--audit", "--json"], &store));
    // The tests' open grants, and the retention policy.
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(bin::open_config()).expect("config"))
            .expect("json");
    config["store"] = json!({"retain": "7d", "compact_after": "1d"});
    let path = dir.path().join("config.json");
    std::fs::write(&path, config.to_string()).expect("config");
    let s = serve::Server::start_config(&store, &path, None, |_| {});
    let c = serve::client();
    // Applied in the background at start: wait for the old run to be gone.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (status, _) = serve::send(c.get(s.url(&format!("/runs/{old}")))).await;
        if status == 404 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never pruned");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    loop {
        let o = out_of(&["runs", "--stats"], &store);
        if json_out(&o)["compacted_runs"] == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never compacted");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (status, got) = serve::send(c.get(s.url(&format!("/runs/{kept}")))).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(
        got, shown,
        "GET /runs/{{id}} of a compacted run is its description as before"
    );
    let (status, got) = serve::send(c.get(s.url(&format!("/runs/{kept}/audit")))).await;
    assert_eq!((status, &got), (200, &audit["audit"]));
    let (status, got) = serve::send(c.get(s.url(&format!("/runs/{kept}/result")))).await;
    assert_eq!((status, &got["output"]), (200, &greeted()), "{got}");
    serve::refused(
        serve::send(c.get(s.url(&format!("/runs/{kept}/events")))).await,
        410,
        "store.compacted",
    );
    let (status, got) = serve::send(c.get(s.url(&format!("/runs/{waiting}")))).await;
    assert_eq!((status, &got["status"]), (200, &json!("waiting")), "{got}");
}
