//! Issue 45: a run is its record. What a run was defined with (its goal with `${VAR}`
//! placeholders by name, its delegate goals by content, the tools its MCP servers announced) is
//! recorded when it starts, and every reader of the stored run — `show`, `replay`, `export`, the
//! audit, the trace, `decide`, the server's views — rebuilds it from that record alone: with
//! the variable unset, the delegate's file moved away, the MCP server not running. A store
//! written by the previous release opens, shows and resumes (and is upgraded on resume).
//!
//! Everything goes through the binary; the tool service is a real HTTP server on 127.0.0.1 and
//! the MCP server is the npm one `scripts/setup-mcp.sh` installs.

#[path = "common/bin.rs"]
mod bin;
#[path = "common/serve.rs"]
mod serve;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};

/// A loopback HTTP service answering every request with `{"temp": 21}`, counting requests.
fn weather_service() -> (String, Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 4096];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            counted.fetch_add(1, Ordering::SeqCst);
            let body = r#"{"temp": 21}"#;
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (url, hits)
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "not JSON: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn ok(out: &Output, what: &str) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `dagloop --store STORE ARGS...` in `dir`.
fn cmd(dir: &Path, store: &Path, args: &[&str]) -> std::process::Command {
    let mut c = bin::dagloop();
    c.current_dir(dir).arg("--store").arg(store).args(args);
    c
}

/// A goal whose one http tool takes its base URL from `${SVC_URL}`, and its scripted model.
fn weather_goal(dir: &Path) -> PathBuf {
    let script = json!({"turns": [
        {"solution": {"calls": [{"_tool": "getWeather", "city": "Paris", "_outputPath": "†state.w"}],
                      "output": null}},
        {"solution": {"calls": [], "output": {"temp": "†state.w.temp"}}}
    ]});
    std::fs::write(dir.join("weather.script.json"), script.to_string()).expect("script");
    let goal = json!({
        "goal": "Report the temperature.",
        "model": "scripted:weather.script.json",
        "env": ["SVC_URL"],
        "output_schema": {"type": "object", "required": ["temp"]},
        "tools": [{"_tool": "getWeather", "_activity": "http",
                   "_http": {"method": "GET", "url": "${SVC_URL}/weather"},
                   "type": "object", "properties": {"city": {"type": "string"}}}]
    });
    let path = dir.join("weather.goal.json");
    std::fs::write(&path, goal.to_string()).expect("goal");
    path
}

#[test]
fn a_run_using_an_env_placeholder_is_read_without_the_variable() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("runs.db");
    weather_goal(dir.path());
    let (url, hits) = weather_service();
    let out = cmd(
        dir.path(),
        &store,
        &["run", "weather.goal.json", "--json", "--approve", "auto"],
    )
    .env("SVC_URL", &url)
    .output()
    .expect("run");
    ok(&out, "run");
    let v = json_of(&out);
    assert_eq!(v["status"], "succeeded", "{v}");
    assert_eq!(v["output"]["temp"], 21, "{v}");
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    let id = v["run_id"].as_str().expect("run id").to_string();

    // Every reader of the stored run, with the variable unset.
    let cassette = dir.path().join("cassette");
    let cassette_arg = cassette.to_string_lossy().to_string();
    for args in [
        vec!["show", id.as_str(), "--json"],
        vec!["show", id.as_str(), "--audit", "--json"],
        vec!["show", id.as_str(), "--trace", "--json"],
        vec!["replay", id.as_str()],
        vec!["export", id.as_str(), "--cassette", cassette_arg.as_str()],
    ] {
        let out = cmd(dir.path(), &store, &args)
            .env_remove("SVC_URL")
            .output()
            .expect("reader");
        ok(&out, &args.join(" "));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!text.contains("goal.invalid"), "{}: {text}", args.join(" "));
    }
    let out = cmd(dir.path(), &store, &["replay", &id])
        .env_remove("SVC_URL")
        .output()
        .expect("replay");
    assert_eq!(json_of(&out)["status"], "identical", "{}", json_of(&out));

    // The cassette re-runs the run offline, the variable still unset, no request made.
    let model = format!("scripted:{}", cassette.join("model.json").display());
    let tools = cassette.join("tools.json");
    let out = cmd(
        dir.path(),
        &store,
        &[
            "run",
            "weather.goal.json",
            "--json",
            "--no-store",
            "--model",
            &model,
            "--tools-from",
            &tools.to_string_lossy(),
        ],
    )
    .env_remove("SVC_URL")
    .output()
    .expect("cassette run");
    ok(&out, "cassette run");
    assert_eq!(json_of(&out)["output"]["temp"], 21);
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "the cassette made no request"
    );

    // A process that drives the run still needs the variable: a new run without it is refused.
    let out = cmd(dir.path(), &store, &["run", "weather.goal.json", "--json"])
        .env_remove("SVC_URL")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json_of(&out)["error"]["code"], "goal.invalid");
}

fn copy_delegate_example(to: &Path) {
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

fn approve_file(dir: &Path) -> PathBuf {
    let p = dir.join("approve.json");
    std::fs::write(
        &p,
        r#"{"decisions": [{"tool": "translateReply", "decision": "approve"}]}"#,
    )
    .expect("decisions");
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_delegate_goal_moved_is_shown_replayed_and_resumed() {
    let dir = tempfile::tempdir().expect("tmp");
    copy_delegate_example(dir.path());
    let store = dir.path().join("runs.db");
    let out = cmd(
        dir.path(),
        &store,
        &["run", "goal.json", "--approve", "ask", "--detach", "--json"],
    )
    .output()
    .expect("run");
    let v = json_of(&out);
    assert_eq!(v["status"], "waiting", "{v}");
    let id = v["run_id"].as_str().expect("id").to_string();

    // The delegate's goal file is moved away (and another put in its place would not matter).
    let moved = dir.path().join("elsewhere");
    std::fs::create_dir(&moved).expect("mkdir");
    std::fs::rename(
        dir.path().join("translator.goal.json"),
        moved.join("translator.goal.json"),
    )
    .expect("move");

    let out = cmd(dir.path(), &store, &["show", &id, "--json"])
        .output()
        .expect("show");
    ok(&out, "show");
    let shown = json_of(&out);
    assert_eq!(shown["status"], "waiting", "{shown}");
    let out = cmd(dir.path(), &store, &["replay", &id])
        .output()
        .expect("replay");
    ok(&out, "replay");

    // The server's view of it.
    let server = serve::Server::start(&store, None);
    let (status, body) = serve::send(serve::client().get(server.url(&format!("/runs/{id}")))).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) =
        serve::send(serve::client().get(server.url(&format!("/runs/{id}/approvals")))).await;
    assert_eq!(status, 200, "{body}");
    drop(server);

    // Resumed, it runs the delegate it was defined with: the translation is the delegate's.
    let approve = approve_file(dir.path());
    let out = cmd(
        dir.path(),
        &store,
        &["resume", &id, "--json", "--decisions"],
    )
    .arg(&approve)
    .output()
    .expect("resume");
    ok(&out, "resume");
    let v = json_of(&out);
    assert_eq!(v["status"], "succeeded", "{v}");
    let translated = v["calls"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["tool"] == "translateReply")
        .cloned()
        .unwrap_or_default();
    assert_eq!(translated["status"], "done", "{v:#}");
}

/// The installed npm servers, or None when the MCP tests are skipped.
fn npm() -> Option<PathBuf> {
    if std::env::var("DAGLOOP_SKIP_MCP").as_deref() == Ok("1") {
        eprintln!("tests/run_record.rs: MCP case SKIPPED (DAGLOOP_SKIP_MCP=1)");
        return None;
    }
    let dir = std::env::var_os("DAGLOOP_MCP_NPM")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/dagloop/npm")))
        .unwrap_or_default()
        .join("node_modules/.bin/mcp-server-everything");
    assert!(
        dir.exists(),
        "{} is not installed: run scripts/setup-mcp.sh (or set DAGLOOP_SKIP_MCP=1)",
        dir.display()
    );
    Some(dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_run_of_mcp_tools_is_decided_while_the_server_is_not_running() {
    let Some(everything) = npm() else { return };
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("runs.db");
    // The server is started through a wrapper the test removes while the run is parked: any
    // reader that tried to start it would fail.
    let wrapper = dir.path().join("everything.sh");
    let script = format!("#!/bin/sh\nexec '{}' stdio\n", everything.display());
    std::fs::write(&wrapper, &script).expect("wrapper");
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let model = json!({"turns": [
        {"solution": {"calls": [{"_tool": "echo", "message": "hello", "_outputPath": "†state.e"}],
                      "output": null}},
        {"solution": {"calls": [], "output": {"echo": "†state.e"}}}
    ]});
    std::fs::write(dir.path().join("m.json"), model.to_string()).expect("model");
    let goal = json!({
        "goal": "Echo hello.",
        "model": "scripted:m.json",
        "output_schema": {"type": "object", "required": ["echo"]},
        "mcp_servers": [{"name": "everything", "command": wrapper.to_string_lossy()}]
    });
    std::fs::write(dir.path().join("goal.json"), goal.to_string()).expect("goal");
    let out = cmd(
        dir.path(),
        &store,
        &["run", "goal.json", "--approve", "ask", "--detach", "--json"],
    )
    .output()
    .expect("run");
    let v = json_of(&out);
    assert_eq!(v["status"], "waiting", "{v}");
    let id = v["run_id"].as_str().expect("id").to_string();
    let call = v["awaiting"][0]["call_id"].as_u64().expect("call id");
    assert_eq!(v["awaiting"][0]["call"]["_tool"], "echo", "{v}");

    std::fs::remove_file(&wrapper).expect("remove the server");

    // Shown as waiting with its call, listed to reviewers, decided: no server needed.
    let out = cmd(dir.path(), &store, &["show", &id, "--json"])
        .output()
        .expect("show");
    ok(&out, "show");
    let shown = json_of(&out);
    assert_eq!(shown["status"], "waiting", "{shown}");
    assert!(!shown.to_string().contains("unknown tool"), "{shown}");
    let server = serve::Server::start(&store, None);
    let (status, body) =
        serve::send(serve::client().get(server.url(&format!("/runs/{id}/approvals")))).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.to_string().contains("\"echo\""),
        "the reviewer sees the call: {body}"
    );
    drop(server);
    let out = cmd(
        dir.path(),
        &store,
        &["decide", &id, &call.to_string(), "approve"],
    )
    .output()
    .expect("decide");
    ok(&out, "decide");

    // Put back, the server runs the approved call when the run is resumed.
    std::fs::write(&wrapper, &script).expect("wrapper");
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let out = cmd(dir.path(), &store, &["resume", &id, "--json", "--detach"])
        .output()
        .expect("resume");
    ok(&out, "resume");
    let v = json_of(&out);
    assert_eq!(v["status"], "succeeded", "{v}");
    assert!(v["output"]["echo"].to_string().contains("hello"), "{v}");
}

/// The store committed as `tests/fixtures/store-802893f.db` was written by dagloop at 802893f
/// (the release before runs recorded their definition), from the delegate example in
/// `/tmp/dagloop-fixture/delegate`: one run waiting on its call 2, one finished.
#[test]
fn a_store_written_by_the_previous_release_opens_shows_and_resumes() {
    let dir = tempfile::tempdir().expect("tmp");
    let work = dir.path().join("delegate");
    std::fs::create_dir(&work).expect("mkdir");
    copy_delegate_example(&work);
    let store = dir.path().join("runs.db");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-802893f.db"),
        &store,
    )
    .expect("copy the fixture");
    // The store moved with its files.
    {
        let c = rusqlite::Connection::open(&store).expect("open");
        c.execute(
            "UPDATE runs SET record = replace(record, '/tmp/dagloop-fixture', ?1)",
            [dir.path().to_string_lossy()],
        )
        .expect("move");
    }
    let out = cmd(&work, &store, &["runs", "--json"])
        .output()
        .expect("runs");
    ok(&out, "runs");
    let rows = json_of(&out);
    let text = rows.to_string();
    assert!(text.contains("run-1a21fd5e679-7e5d-0"), "{text}");
    assert!(text.contains("run-1a21fd5f37d-7f97-0"), "{text}");
    for id in ["run-1a21fd5e679-7e5d-0", "run-1a21fd5f37d-7f97-0"] {
        let out = cmd(&work, &store, &["show", id, "--json"])
            .output()
            .expect("show");
        ok(&out, "show");
    }
    let out = cmd(&work, &store, &["replay", "run-1a21fd5f37d-7f97-0"])
        .output()
        .expect("replay");
    ok(&out, "replay");
    assert_eq!(json_of(&out)["status"], "identical");

    let waiting = "run-1a21fd5e679-7e5d-0";
    let out = cmd(&work, &store, &["decide", waiting, "2", "approve"])
        .output()
        .expect("decide");
    ok(&out, "decide");
    let out = cmd(&work, &store, &["resume", waiting, "--json", "--detach"])
        .output()
        .expect("resume");
    ok(&out, "resume");
    assert_eq!(json_of(&out)["status"], "succeeded");

    // Resumed, the run was upgraded in place: its record now holds its delegate goal.
    let c = rusqlite::Connection::open(&store).expect("open");
    let record: String = c
        .query_row("SELECT record FROM runs WHERE id = ?1", [waiting], |r| {
            r.get(0)
        })
        .expect("row");
    let record: Value = serde_json::from_str(&record).expect("JSON");
    let delegates = &record["options"]["record"]["delegates"];
    assert!(
        delegates["/tools/1/_delegate"]["goal"]["goal"].is_string(),
        "{record:#}"
    );
}

/// `dagloop serve` in `dir` with the operator's everything server (its approval map
/// `approval`), and a script (returned) whose one call is that server's `echo`.
fn operator_mcp_server(dir: &Path, everything: &Path, approval: Value) -> (serve::Server, PathBuf) {
    let config = dir.join("config.json");
    std::fs::write(
        &config,
        json!({
            "grants": {"tools": ["mcp"], "files": [dir.display().to_string()]},
            "mcp_servers": {"everything": {"command": everything.display().to_string(),
                "args": ["stdio"], "approval": approval}}
        })
        .to_string(),
    )
    .expect("config");
    let script = json!({"turns": [
        {"solution": {"calls": [{"_tool": "echo", "message": "delete everything", "_outputPath": "†state.e"}],
                      "output": null}},
        {"solution": {"calls": [], "output": {"e": "†state.e"}}}
    ]});
    let sp = dir.join("s.json");
    std::fs::write(&sp, script.to_string()).expect("script");
    let server = serve::Server::start_config(&dir.join("runs.db"), &config, None, |_| {});
    (server, sp)
}

/// With the operator's MCP server in `dagloop serve` (a destructive tool the operator always
/// asks about), the run's view is rebuilt from its record, which holds the tools the server
/// announced: the call is listed to reviewers, and once approved through the API the view says it
/// ran (it once said "refused: unknown tool").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_view_of_an_operator_mcp_call_says_what_happened_to_it() {
    let Some(everything) = npm() else { return };
    let dir = tempfile::tempdir().expect("tmp");
    let (server, sp) = operator_mcp_server(dir.path(), &everything, json!({"echo": "always"}));
    let id = serve::create(
        &server,
        &json!({"goal": {"goal": "echo", "model": format!("scripted:{}", sp.display()),
            "output_schema": {"type": "object"}, "mcp_servers": [{"name": "everything"}]}}),
    )
    .await;
    let v = serve::until(&server, &id, |v| serve::awaiting(v).len() == 1).await;
    assert_eq!(v["awaiting"][0]["call"]["_tool"], "echo", "{v}");
    let call = v["awaiting"][0]["call_id"].as_u64().expect("call id");
    serve::approve(&server, &id, call).await;
    let v = serve::until(&server, &id, |v| v["status"] == "succeeded").await;
    let echo = v["calls"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["tool"] == "echo")
        .cloned()
        .unwrap_or_default();
    assert_eq!(echo["status"], "done", "{v:#}");
    assert!(!v.to_string().contains("unknown tool"), "{v:#}");
    // Its cassette holds what the call returned (it once recorded no result).
    let (status, cassette) =
        serve::send(serve::client().get(server.url(&format!("/runs/{id}/cassette")))).await;
    assert_eq!(status, 200, "{cassette}");
    let recorded: Vec<&Value> = cassette["tools"]["calls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["tool"] == "echo")
        .collect();
    assert_eq!(recorded.len(), 1, "{cassette:#}");
    assert!(
        recorded[0].to_string().contains("delete everything")
            && recorded[0].get("result").is_some(),
        "{cassette:#}"
    );
}

/// The `node` processes of the everything server among the descendants of `pid`.
fn everything_processes_under(pid: u32) -> usize {
    let mut parent = std::collections::BTreeMap::new();
    let mut cmdlines = std::collections::BTreeMap::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // The fields after the command's closing parenthesis: state, ppid, ...
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|s| s.parse::<u32>().ok())
            .unwrap_or(0);
        parent.insert(p, ppid);
        let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        cmdlines.insert(p, String::from_utf8_lossy(&cmd).replace('\0', " "));
    }
    let under = |mut p: u32| {
        while let Some(&pp) = parent.get(&p) {
            if pp == pid {
                return true;
            }
            if pp <= 1 {
                return false;
            }
            p = pp;
        }
        false
    };
    cmdlines
        .iter()
        .filter(|(p, c)| c.starts_with("node ") && c.contains("everything") && under(**p))
        .count()
}

/// Runs whose goals name the operator's MCP server with different approval maps share its one
/// process (40 such runs once started 40 copies of the server), and each is still gated by its
/// own map.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_with_different_approval_maps_share_the_operators_mcp_server() {
    let Some(everything) = npm() else { return };
    let dir = tempfile::tempdir().expect("tmp");
    let (server, sp) = operator_mcp_server(dir.path(), &everything, json!({}));
    for map in [
        json!({"echo": "never"}),
        json!({"echo": "always"}),
        json!({"add": "always"}),
    ] {
        let id = serve::create(
            &server,
            &json!({"goal": {"goal": "echo", "model": format!("scripted:{}", sp.display()),
                "output_schema": {"type": "object"},
                "mcp_servers": [{"name": "everything", "approval": map}]}}),
        )
        .await;
        // Each run is gated by its own map, though the process was started for the first:
        // `echo: always` waits for a reviewer, the others run the call and finish.
        let asks = map["echo"] == "always";
        let v = serve::until(&server, &id, |v| {
            if asks {
                serve::awaiting(v).len() == 1
            } else {
                v["status"] == "succeeded"
            }
        })
        .await;
        assert_eq!(v["calls"][0]["tool"], "echo", "{v}");
    }
    assert_eq!(everything_processes_under(server.child.id()), 1);
}

/// One record of a run: the store's row and Temporal's workflow input are one type
/// (`temporal::RunSpec` flattens `store::RunRecord`). A workflow input written before the two merged
/// (`run_id`, no `created_at`, typed options) loads as the record and defines the same run; the
/// record reads back what it wrote.
#[test]
fn a_temporal_input_from_before_the_merge_loads_as_the_runs_record() {
    let goal = json!({
        "goal": "Say hi",
        "model": "scripted:hi.json",
        "env": ["SVC_URL"],
        "output_schema": {"type": "object"},
        "tools": [{"_tool": "step", "_activity": "http",
                   "_http": {"method": "GET", "url": "${SVC_URL}/step"},
                   "type": "object", "properties": {}}]
    });
    let old = json!({
        "run_id": "run-old-1",
        "goal": goal,
        "base_dir": "/nowhere",
        "options": {"approve": "auto"}
    });
    let record: dagloop::store::RunRecord =
        serde_json::from_value(old).expect("an old Temporal input loads as the record");
    assert_eq!(record.id, "run-old-1");
    assert_eq!(record.created_at, 0);
    let again: dagloop::store::RunRecord =
        serde_json::from_value(serde_json::to_value(&record).expect("JSON")).expect("reads back");
    assert_eq!(again, record);
    // A reader defines the run from it alone, the variable unset.
    let def = dagloop::runs::RunDef::from_record(&record).expect("defined");
    let machine = def.machine(&record.id).expect("a machine");
    assert!(machine.awaiting().is_empty());
}
