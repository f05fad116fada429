//! The terminal reviewer through a real pseudo-terminal (`dagloop run --approve ask` with stdin
//! and stderr on a PTY): the prompt is visible and stays so, each answer does what it says, a
//! reviewer timeout withdraws the prompt and the process exits, Ctrl-C cancels at once.

#[path = "common/bin.rs"]
mod bin;

#[path = "common/e2e.rs"]
mod harness;
#[path = "common/serve.rs"]
mod serve;

use harness::{ToolServer, Workspace};
use rexpect::session::{PtySession, spawn_command};
use serde_json::{Value, json};

fn probe(server: &ToolServer, patch: impl FnOnce(&mut Value)) -> Workspace {
    Workspace::new(
        "probe.goal.json",
        "scripts/ping_then_answer.script.json",
        &server.base,
        patch,
    )
}

fn dagloop(ws: &Workspace, store: &std::path::Path) -> PtySession {
    let mut cmd = bin::dagloop();
    cmd.arg("run")
        .arg(&ws.goal)
        .args(["--approve", "ask"])
        .env("DAGLOOP_STORE", store)
        .env_remove("OPENAI_API_KEY");
    spawn_command(cmd, Some(20_000)).expect("spawn in a pty")
}

async fn in_pty<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("pty session")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prompt_is_visible_and_approve_runs_the_call() {
    let server = ToolServer::start().await;
    let ws = probe(&server, |_| {});
    let store = ws.goal.with_file_name("runs.db");
    let out = in_pty(move || {
        let mut p = dagloop(&ws, &store);
        // One line per call: id, tool, resolved params; then the answers.
        p.exp_string("c1 ping {\"n\":7}")
            .expect("the call on one line");
        p.exp_string("[a]pprove [A]pprove all ping [e]dit [r]eject [s]end back [d]etach [?]show >")
            .expect("the prompt is on screen");
        p.send_line("?").expect("send");
        p.exp_string("\"_tool\": \"ping\"").expect("the whole call");
        p.exp_string("[a]pprove").expect("asked again");
        p.send_line("a").expect("send");
        let rest = p.exp_eof().expect("exits when the run ends");
        // Read back before the workspace (and the store in it) goes.
        let id = rest
            .split("\"run_id\": \"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or_default()
            .to_string();
        let shown = bin::dagloop()
            .args(["show", "--json", &id])
            .env("DAGLOOP_STORE", &store)
            .output()
            .expect("show");
        let presentation = serve::decided_presentation(&store, &id, 1);
        drop(ws);
        (rest, shown, presentation)
    })
    .await;
    let (out, shown, (named, presented)) = out;
    // The terminal's decision named the presentation it answered (DESIGN.md 3.6).
    assert!(
        named.is_some() && named == presented,
        "{named:?} / {presented:?}"
    );
    assert!(out.contains("\"status\": \"succeeded\""), "{out}");
    assert_eq!(server.hits("/ping"), 1);
    // The decision is journaled as the terminal user's.
    let shown: Value = serde_json::from_slice(&shown.stdout).expect("JSON");
    let by = &shown["calls"][0]["decided_by"];
    assert_eq!(by["channel"], "terminal", "{shown}");
    assert!(
        by["principal"].as_str().is_some_and(|p| !p.is_empty()),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_asks_for_a_reason_and_the_call_never_runs() {
    let server = ToolServer::start().await;
    let ws = probe(&server, |_| {});
    let store = ws.goal.with_file_name("runs.db");
    let out = in_pty(move || {
        let mut p = dagloop(&ws, &store);
        p.exp_string("[r]eject").expect("prompt");
        p.send_line("r").expect("send");
        p.exp_string("reason >").expect("asks why");
        p.send_line("not on a Sunday").expect("send");
        let rest = p.exp_eof().expect("exit");
        drop(ws);
        rest
    })
    .await;
    assert!(out.contains("\"rejected\""), "{out}");
    assert!(out.contains("\"decision\": \"reject\""), "{out}");
    assert_eq!(server.hits("/ping"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reviewer_timeout_withdraws_the_prompt_and_the_process_exits() {
    let server = ToolServer::start().await;
    let ws =
        probe(
            &server,
            |g| {
                g["approval"] =
                    json!({"policy": "ask", "timeout_s": 1, "default_decision": "reject"})
            },
        );
    let store = ws.goal.with_file_name("runs.db");
    let out = in_pty(move || {
        let mut p = dagloop(&ws, &store);
        p.exp_string("[a]pprove").expect("prompt");
        p.exp_string("c1 was decided: rejected")
            .expect("withdrawn after the timeout");
        let rest = p.exp_eof().expect("the process exits without an answer");
        drop(ws);
        rest
    })
    .await;
    assert!(out.contains("\"status\": \"succeeded\""), "{out}");
    assert_eq!(server.hits("/ping"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_at_the_prompt_cancels_the_run_and_exits() {
    let server = ToolServer::start().await;
    let ws = probe(&server, |_| {});
    let store = ws.goal.with_file_name("runs.db");
    let out = in_pty(move || {
        let mut p = dagloop(&ws, &store);
        p.exp_string("[a]pprove").expect("prompt");
        p.send_control('c').expect("ctrl-c");
        let rest = p.exp_eof().expect("exits");
        drop(ws);
        rest
    })
    .await;
    assert!(out.contains("\"status\": \"cancelled\""), "{out}");
    assert_eq!(server.hits("/ping"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edit_opens_the_editor_checks_the_params_and_shows_the_change() {
    let server = ToolServer::start().await;
    let ws = probe(&server, |_| {});
    let store = ws.goal.with_file_name("runs.db");
    // An "editor" that changes n from 7 to 9 in the file it is given.
    let editor = ws.goal.with_file_name("editor.sh");
    std::fs::write(&editor, "#!/bin/sh\nsed -i 's/7/9/' \"$1\"\n").expect("editor");
    executable(&editor);
    let out = in_pty(move || {
        let mut cmd = bin::dagloop();
        cmd.arg("run")
            .arg(&ws.goal)
            .args(["--approve", "ask"])
            .env("DAGLOOP_STORE", &store)
            .env("EDITOR", &editor)
            .env_remove("VISUAL");
        let mut p = spawn_command(cmd, Some(20_000)).expect("spawn in a pty");
        p.exp_string("[e]dit").expect("prompt");
        p.send_line("e").expect("send");
        p.exp_string("- n: 7").expect("the old value");
        p.exp_string("+ n: 9").expect("the new value");
        p.exp_string("send this edit? [y/n]").expect("confirm");
        p.send_line("y").expect("send");
        let rest = p.exp_eof().expect("exit");
        drop(ws);
        rest
    })
    .await;
    assert!(out.contains("\"decision\": \"edit\""), "{out}");
    let bodies: Vec<Value> = server
        .requests()
        .iter()
        .map(|r| r["body"].clone())
        .collect();
    assert_eq!(bodies, vec![json!({"n": 9})], "the edited params ran");
}

/// dagloop turns transparent huge pages off for itself (`PR_SET_THP_DISABLE`, which fork and
/// exec pass on); the reviewer's `$EDITOR` has them as the system does, like a shell tool's
/// program (tests/lifecycle.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_editor_runs_with_transparent_huge_pages_though_dagloop_has_them_off() {
    let own = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if bin::thp_enabled(&own) != Some(1) {
        eprintln!("SKIPPED: this kernel does not say THP_enabled, or this process has them off");
        return;
    }
    let server = ToolServer::start().await;
    let ws = probe(&server, |_| {});
    let store = ws.goal.with_file_name("runs.db");
    // An "editor" that records its own status and its parent's (dagloop's), changing nothing.
    let editor = ws.goal.with_file_name("editor.sh");
    let seen = ws.goal.with_file_name("seen.txt");
    std::fs::write(
        &editor,
        format!(
            "#!/bin/sh\n{{ cat /proc/$$/status; echo PARENT; cat /proc/$PPID/status; }} > '{}'\n",
            seen.display()
        ),
    )
    .expect("editor");
    executable(&editor);
    let text = in_pty(move || {
        let mut cmd = bin::dagloop();
        cmd.arg("run")
            .arg(&ws.goal)
            .args(["--approve", "ask"])
            .env("DAGLOOP_STORE", &store)
            .env("EDITOR", &editor)
            .env_remove("VISUAL")
            .env_remove("MIMALLOC_ALLOW_THP");
        let mut p = spawn_command(cmd, Some(20_000)).expect("spawn in a pty");
        p.exp_string("[e]dit").expect("prompt");
        p.send_line("e").expect("send");
        p.exp_string("(no change)").expect("the unchanged params");
        p.send_control('c').expect("ctrl-c");
        p.exp_eof().expect("exit");
        let text = std::fs::read_to_string(&seen).expect("the editor ran");
        drop(ws);
        text
    })
    .await;
    let (editor, parent) = text.split_once("PARENT").expect("two statuses");
    assert_eq!(
        bin::thp_enabled(parent),
        Some(0),
        "dagloop has them off: {parent}"
    );
    assert_eq!(
        bin::thp_enabled(editor),
        Some(1),
        "the editor has them on: {editor}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_all_answers_every_later_call_of_the_tool() {
    let server = ToolServer::start().await;
    let ws = probe(&server, |_| {});
    let script = json!({"turns": [
        {"solution": {"calls": [
            {"_tool": "ping", "n": 1, "_outputPath": "†state.a"},
            {"_tool": "ping", "n": 2, "_outputPath": "†state.b"}], "output": null}},
        {"solution": {"calls": [], "output": {"answer": 42}}}
    ]});
    std::fs::write(
        ws.goal.with_file_name("ping_then_answer.script.json"),
        script.to_string(),
    )
    .expect("script");
    let store = ws.goal.with_file_name("runs.db");
    let out = in_pty(move || {
        let mut p = dagloop(&ws, &store);
        p.exp_string("[A]pprove all ping").expect("prompt");
        p.send_line("A").expect("send");
        p.exp_string("approved (every call of this tool)")
            .expect("the second call answered");
        let rest = p.exp_eof().expect("exit");
        drop(ws);
        rest
    })
    .await;
    assert!(out.contains("\"status\": \"succeeded\""), "{out}");
    assert_eq!(server.hits("/ping"), 2);
}

/// Makes the script at `path` executable (an `$EDITOR` the tests write).
fn executable(path: &std::path::Path) {
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(path)
        .status()
        .expect("chmod");
}
