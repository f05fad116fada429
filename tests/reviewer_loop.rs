//! The loop a reviewer walks, end to end through the binaries (issue 48, items 1 and 2): a run
//! started with `dagloop run --detach` waits for a reviewer; its notification links to the page
//! as `?run=ID&call=N`; the page opens that run with that call's card focused; the reviewer
//! approves on the page, and the run moves: the server, which did not start the run, takes it
//! over (the run is its record: nothing of the starting process is needed) and drives it to its
//! end. A server whose grants do not cover the run says so, and who can continue it.
//!
//! The tool is a counting HTTP service on 127.0.0.1 (each call must run exactly once); the page
//! runs in headless Chromium (`scripts/setup-browser.sh`; DAGLOOP_SKIP_BROWSER=1 skips that case).

#[path = "common/bin.rs"]
mod bin;
#[path = "common/browser.rs"]
mod browser;
#[path = "common/desk.rs"]
mod desk;
#[path = "common/e2e.rs"]
mod harness;
#[path = "common/serve.rs"]
mod serve;

use std::path::Path;

use serde_json::{Value, json};

/// `dagloop run goal.json --approve ask --detach` in `dir` on `store`: the run id and the calls
/// awaiting a decision.
fn detached_run(dir: &Path, store: &Path, url: &str) -> (String, Vec<Value>) {
    detached_run_with(dir, store, url, &[])
}

/// [`detached_run`] with `global` options before `run` (`--config FILE`).
fn detached_run_with(dir: &Path, store: &Path, url: &str, global: &[&str]) -> (String, Vec<Value>) {
    let goal = serve::goal(dir, url, "ask");
    std::fs::write(dir.join("goal.json"), goal.to_string()).expect("goal");
    let out = bin::dagloop()
        .current_dir(dir)
        .arg("--store")
        .arg(store)
        .args(global)
        .args(["run", "goal.json", "--detach", "--json"])
        .output()
        .expect("run");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "not JSON: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(v["status"], "waiting", "{v}");
    let awaiting = v["awaiting"].as_array().cloned().unwrap_or_default();
    assert_eq!(awaiting.len(), 2, "{v}");
    (v["run_id"].as_str().expect("id").to_string(), awaiting)
}

/// `POST /runs/{id}/approvals/{call}` approving, as a reviewer's client sends it.
async fn approve_through(server: &serve::Server, id: &str, call: u64) -> (u16, Value) {
    serve::send(
        serve::client()
            .post(server.url(&format!("/runs/{id}/approvals/{call}")))
            .json(&json!({"decision": "approve"})),
    )
    .await
}

fn call_with_n(awaiting: &[Value], n: u64) -> u64 {
    awaiting
        .iter()
        .find(|a| a["call"]["n"] == n)
        .and_then(|a| a["call_id"].as_u64())
        .unwrap_or_else(|| panic!("no call with n = {n}: {awaiting:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_through_the_server_moves_a_run_started_with_detach() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("runs.db");
    let (url, counts) = serve::counting_service().await;
    let (id, awaiting) = detached_run(dir.path(), &store, &url);

    let server = serve::Server::start(&store, None);
    let first = call_with_n(&awaiting, 1);
    let (status, body) = approve_through(&server, &id, first).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("applied")),
        "{body}"
    );
    // The run moved: the approved call ran, and the other one is now presented by this server.
    let v = serve::until(&server, &id, |v| {
        serve::awaiting(v).len() == 1 && v["status"] == "waiting"
    })
    .await;
    let second = call_with_n(&serve::awaiting(&v), 2);
    serve::approve(&server, &id, second).await;
    let v = serve::until(&server, &id, |v| v["status"] == "succeeded").await;
    assert_eq!(v["output"]["b"], 20, "{v}");
    let counts = counts.lock().expect("counts").clone();
    assert_eq!(counts.get(&1), Some(&1), "{counts:?}");
    assert_eq!(counts.get(&2), Some(&1), "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_cannot_continue_a_run_says_who_can() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("runs.db");
    let (url, counts) = serve::counting_service().await;
    let (id, awaiting) = detached_run(dir.path(), &store, &url);
    // An operator config that grants http tools but no loopback address and no file root the
    // run's scripted model is in.
    let config = dir.path().join("closed.json");
    std::fs::write(&config, r#"{"grants": {"tools": ["http"]}}"#).expect("config");
    let server = serve::Server::start_config(&store, &config, None, |_| {});
    let first = call_with_n(&awaiting, 1);
    let (status, body) = approve_through(&server, &id, first).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (202, Some("recorded")),
        "{body}"
    );
    let detail = body["detail"].as_str().unwrap_or("");
    assert!(detail.contains("cannot continue"), "{detail}");
    assert!(detail.contains(&format!("dagloop resume {id}")), "{detail}");
    assert!(
        detail.contains("grant."),
        "names the grant it lacks: {detail}"
    );
    drop(server);
    assert!(counts.lock().expect("counts").is_empty(), "nothing ran");

    // Where it was started, `resume` applies the recorded decision.
    let out = bin::dagloop()
        .current_dir(dir.path())
        .arg("--store")
        .arg(&store)
        .args(["resume", &id, "--detach", "--json"])
        .output()
        .expect("resume");
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["status"], "waiting", "{v}");
    assert_eq!(counts.lock().expect("counts").get(&1), Some(&1));
}

/// The whole loop in a browser: the notification's link opens the run with its call focused,
/// `a` approves it, the second call is approved with its button, and the run finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_notification_link_opens_the_call_and_a_decision_on_the_page_finishes_the_run() {
    let Some(session) = browser::session().await else {
        return;
    };
    let c = &session.c;
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("runs.db");
    let (url, counts) = serve::counting_service().await;
    let server = serve::Server::start(&store, None);
    // The operator's config names a webhook, and the server's page for its links.
    let hook = desk::receiver(0).await;
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(bin::open_config()).expect("config"))
            .expect("json");
    config["notify"] = json!({"webhook": {"url": hook.url, "backoff_ms": 50,
        "page_url": server.base}});
    let config_path = dir.path().join("config.json");
    std::fs::write(&config_path, config.to_string()).expect("config");
    let config_arg = config_path.display().to_string();
    let (id, awaiting) =
        detached_run_with(dir.path(), &store, &url, &["--config", config_arg.as_str()]);
    let second = call_with_n(&awaiting, 2);

    // The link the webhook got for the second call (delivered before `run` exited).
    let got = hook.got.lock().expect("got").clone();
    let link = got
        .iter()
        .find(|(_, b)| b["run_id"] == id.as_str() && b["call_id"] == second)
        .and_then(|(_, b)| b["link"].as_str().map(String::from))
        .unwrap_or_else(|| panic!("no link for call {second}: {got:?}"));
    assert_eq!(link, server.url(&format!("/?run={id}&call={second}")));
    c.goto(&link).await.expect("open the link");
    browser::until(
        c,
        "the linked run selected",
        &format!("return document.querySelector('#run-id').textContent === '{id}'"),
    )
    .await;
    browser::until(
        c,
        "the linked call's card focused",
        &format!(
            "const card = document.querySelector('.approval[data-call-id=\"{second}\"]');
             return card !== null && card.classList.contains('linked')
                 && card.classList.contains('current') && document.activeElement === card;"
        ),
    )
    .await;
    browser::save_screenshot(c, "reviewer-loop-linked-call.png").await;
    // `a` approves the focused card's call: the linked one, not the first in the list.
    browser::press(c, "a").await;
    browser::until(
        c,
        "the linked call applied",
        &format!(
            "return [...document.querySelectorAll('.approval[data-call-id=\"{second}\"]')]
                .every(c => c.classList.contains('sent'))"
        ),
    )
    .await;
    let v = serve::until(&server, &id, |v| serve::awaiting(v).len() == 1).await;
    let first = call_with_n(&serve::awaiting(&v), 1);
    assert_eq!(counts.lock().expect("counts").get(&2), Some(&1));
    browser::until(
        c,
        "the other call's card",
        &format!("return document.querySelector('.approval[data-call-id=\"{first}\"] button.approve') !== null"),
    )
    .await;
    browser::click(
        c,
        &format!(".approval[data-call-id=\"{first}\"] button.approve"),
    )
    .await;
    let v = serve::until(&server, &id, |v| v["status"] == "succeeded").await;
    assert_eq!(v["output"]["b"], 20, "{v}");
    browser::until(
        c,
        "the run shown finished",
        "return /succeeded/.test(document.querySelector('#run').textContent)",
    )
    .await;
    browser::save_screenshot(c, "reviewer-loop-finished.png").await;
    browser::no_errors(c).await;
    let counts = counts.lock().expect("counts").clone();
    assert_eq!(
        (counts.get(&1), counts.get(&2)),
        (Some(&1), Some(&1)),
        "{counts:?}"
    );
}

/// Call ids are accepted as dagloop prints them (`c2`), runs by a unique prefix of their id;
/// a prefix several runs share is refused with their ids, in JSON like every other error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decide_takes_call_ids_as_printed_and_run_id_prefixes() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("runs.db");
    let (url, _counts) = serve::counting_service().await;
    let (id, awaiting) = detached_run(dir.path(), &store, &url);
    let (other, _) = detached_run(dir.path(), &store, &url);
    // The shortest prefix of `id` that `other` does not share.
    let common = id
        .chars()
        .zip(other.chars())
        .take_while(|(a, b)| a == b)
        .count();
    let prefix = &id[..common + 1];
    let call = format!("c{}", call_with_n(&awaiting, 1));
    let decide = |run: &str, call: &str| {
        bin::dagloop()
            .current_dir(dir.path())
            .arg("--store")
            .arg(&store)
            .args(["decide", run, call, "approve"])
            .output()
            .expect("decide")
    };
    let out = decide(prefix, &call);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = decide(&id[..common], &call);
    assert_eq!(out.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["error"]["code"], "cli.ambiguous_run", "{v}");
    let message = v["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains(&id) && message.contains(&other),
        "{message}"
    );
    let out = decide(&id, "two");
    assert_eq!(out.status.code(), Some(2));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("`two` is not a call id"), "{said}");
}

/// The documented way to keep a run's result, `dagloop run goal.json > result.json`, with an edit
/// at the prompt: the editor runs on the terminal, so what it draws (a full-screen editor's escape
/// codes) never lands in the result, which stays valid JSON holding the edited call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_with_stdout_redirected_leaves_the_result_valid_json() {
    let server = harness::ToolServer::start().await;
    let ws = harness::Workspace::new(
        "probe.goal.json",
        "scripts/ping_then_answer.script.json",
        &server.base,
        |_| {},
    );
    let store = ws.goal.with_file_name("runs.db");
    let result = ws.goal.with_file_name("result.json");
    // An "editor" that draws on its stdout as a full-screen editor does, then changes n to 9.
    let editor = ws.goal.with_file_name("editor.sh");
    std::fs::write(
        &editor,
        "#!/bin/sh\nprintf '\\033[?1049h\\033[2J~ editing ~\\033[?1049l'\nsed -i 's/7/9/' \"$1\"\n",
    )
    .expect("editor");
    std::fs::set_permissions(&editor, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let (goal, out_file) = (ws.goal.clone(), result.clone());
    let shown = tokio::task::spawn_blocking(move || {
        let mut cmd = std::process::Command::new("sh");
        cmd.arg("-c")
            .arg(format!(
                "exec '{}' run '{}' --approve ask > '{}'",
                bin::BIN,
                goal.display(),
                out_file.display()
            ))
            .env("XDG_DATA_HOME", bin::data_home())
            .env("DAGLOOP_STORE", &store)
            .env("EDITOR", &editor)
            .env_remove("VISUAL")
            .env_remove("DAGLOOP_TOKEN");
        let mut p = rexpect::session::spawn_command(cmd, Some(20_000)).expect("spawn in a pty");
        p.exp_string("[e]dit").expect("prompt");
        p.send_line("e").expect("send");
        p.exp_string("~ editing ~")
            .expect("the editor drew on the terminal");
        p.exp_string("+ n: 9").expect("the new value");
        p.exp_string("send this edit? [y/n]").expect("confirm");
        p.send_line("y").expect("send");
        p.exp_eof().expect("exit")
    })
    .await
    .expect("pty session");
    let text = std::fs::read_to_string(&result).expect("the result file");
    let v: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("result.json is not JSON ({e}): {text:?}\nterminal: {shown}"));
    assert_eq!(v["status"], "succeeded", "{v}");
    assert!(
        !text.contains('\u{1b}'),
        "no escape code in the result: {text:?}"
    );
    let bodies: Vec<Value> = server
        .requests()
        .iter()
        .map(|r| r["body"].clone())
        .collect();
    assert_eq!(bodies, vec![json!({"n": 9})], "the edited params ran");
    drop(ws);
}
