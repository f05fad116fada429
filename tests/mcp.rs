//! MCP servers as dagloop tools, against real servers from the npm registry (installed by
//! `scripts/setup-mcp.sh`, which `scripts/test` runs): `@modelcontextprotocol/server-everything`
//! over stdio and streamable HTTP, `@modelcontextprotocol/server-filesystem` on a temporary
//! directory, and bad input (missing command, garbage on stdout, timeouts, a killed server).
//! `DAGLOOP_SKIP_MCP=1` skips the tests that need the servers (and says so).

#![cfg(feature = "mcp")]

#[path = "common/bin.rs"]
mod bin;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dagloop::protocol::{Call, Tool, ToolApproval};
use dagloop::tools::mcp::{
    McpError, McpServerConfig, McpServers, ProgressUpdate, StdioServer, is_read_only,
};
use dagloop::tools::{Activity, ActivityError};
use serde_json::{Value, json};

/// The installed servers' `node_modules`, or None when the tests are skipped.
fn npm() -> Option<PathBuf> {
    if std::env::var("DAGLOOP_SKIP_MCP").as_deref() == Ok("1") {
        eprintln!("tests/mcp.rs: SKIPPED (DAGLOOP_SKIP_MCP=1)");
        return None;
    }
    let dir = std::env::var_os("DAGLOOP_MCP_NPM")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/dagloop/npm")))
        .unwrap_or_default()
        .join("node_modules");
    for bin in ["mcp-server-everything", "mcp-server-filesystem"] {
        assert!(
            dir.join(".bin").join(bin).exists(),
            "{bin} is not installed in {}: run scripts/setup-mcp.sh (or set DAGLOOP_SKIP_MCP=1)",
            dir.display()
        );
    }
    Some(dir)
}

fn stdio(name: &str, command: impl Into<String>, args: &[&str]) -> StdioServer {
    StdioServer {
        name: name.into(),
        command: command.into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        ..StdioServer::default()
    }
}

fn everything(npm: &std::path::Path) -> StdioServer {
    let bin = npm.join(".bin/mcp-server-everything");
    stdio("everything", bin.to_string_lossy(), &["stdio"])
}

fn find(servers: &McpServers, name: &str) -> (Tool, Arc<dyn Activity>) {
    servers
        .tools()
        .into_iter()
        .find(|(t, _)| t.name == name)
        .unwrap_or_else(|| panic!("no tool `{name}`"))
}

async fn call(servers: &McpServers, name: &str, params: Value) -> Result<Value, ActivityError> {
    let (tool, activity) = find(servers, name);
    let mut c = Call::new(name);
    if let Value::Object(m) = params {
        c.params = m.into();
    }
    activity.run(&tool, Arc::new(c)).await.map(|o| o.value)
}

fn detail_code(e: &ActivityError) -> Option<String> {
    match e {
        ActivityError::Failed { details, .. } => details
            .get("code")
            .and_then(Value::as_str)
            .map(str::to_string),
        _ => None,
    }
}

type Progress = Arc<Mutex<Vec<ProgressUpdate>>>;

/// The progress values a 3-step `trigger-long-running-operation` call delivered: 1, 2, 3 in order,
/// the last possibly missing. The server sends its last notification right before its answer,
/// the SDK handles notifications on tasks of their own, and a notification handled after its
/// call's answer is dropped (progress never follows a call's end), so under load it can be lost.
fn assert_progress_steps(steps: &[f64]) {
    assert!((2..=3).contains(&steps.len()), "{steps:?}");
    assert_eq!(steps, &[1.0, 2.0, 3.0][..steps.len()]);
}

fn progress_sink() -> (Progress, dagloop::tools::mcp::ProgressFn) {
    let seen: Progress = Arc::default();
    let s = seen.clone();
    let f: dagloop::tools::mcp::ProgressFn = Arc::new(move |u| {
        if let Ok(mut v) = s.lock() {
            v.push(u)
        }
    });
    (seen, f)
}

/// echo, get-sum, progress, unknown tool, bad arguments: the same on every transport.
async fn exercise_everything(config: McpServerConfig) {
    let (seen, sink) = progress_sink();
    let servers = McpServers::start_with(&[config], &[], Some(sink))
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", e.code()));

    let echo = call(&servers, "echo", json!({"message": "hello dagloop"})).await;
    assert_eq!(echo, Ok(json!("Echo: hello dagloop")));

    let (sum_tool, _) = find(&servers, "get-sum");
    assert!(is_read_only(&sum_tool));
    assert_eq!(sum_tool.activity.as_deref(), Some("mcp"));
    assert_eq!(sum_tool.schema["properties"]["a"]["type"], json!("number"));
    assert!(sum_tool.schema["description"].as_str().is_some());
    let sum = call(&servers, "get-sum", json!({"a": 2, "b": 3.5})).await;
    let sum = sum.unwrap_or_else(|e| panic!("{e}"));
    assert!(sum.as_str().is_some_and(|s| s.contains("5.5")), "{sum}");

    let bad = call(&servers, "get-sum", json!({"a": "two"})).await;
    let bad = bad.expect_err("bad arguments must fail");
    assert_eq!(
        detail_code(&bad).as_deref(),
        Some("mcp.tool_error"),
        "{bad}"
    );
    assert!(bad.to_string().contains("expected number"), "{bad}");

    let structured = call(
        &servers,
        "get-structured-content",
        json!({"location": "New York"}),
    )
    .await;
    let structured = structured.unwrap_or_else(|e| panic!("{e}"));
    assert!(structured["temperature"].is_number(), "{structured}");

    let unknown = servers
        .call("everything", "no-such-tool", serde_json::Map::new())
        .await;
    let unknown = unknown.expect_err("an unknown tool must fail");
    assert_eq!(
        detail_code(&unknown).as_deref(),
        Some("mcp.tool_error"),
        "{unknown}"
    );
    assert!(unknown.to_string().contains("not found"), "{unknown}");

    let long = call(
        &servers,
        "trigger-long-running-operation",
        json!({"duration": 0.6, "steps": 3}),
    )
    .await;
    assert!(long.is_ok_and(|v| v.as_str().is_some_and(|s| s.contains("completed"))));
    let seen = seen.lock().map(|v| v.clone()).unwrap_or_default();
    let steps: Vec<f64> = seen.iter().map(|u| u.progress).collect();
    assert_progress_steps(&steps);
    assert!(seen.iter().all(|u| u.total == Some(3.0)
        && u.server == "everything"
        && u.tool == "trigger-long-running-operation"));
    servers.shutdown().await;
}

#[tokio::test]
async fn everything_over_stdio() {
    let Some(npm) = npm() else { return };
    exercise_everything(McpServerConfig::Stdio(everything(&npm))).await;
}

#[tokio::test]
async fn clashing_names_get_the_server_prefix() {
    let Some(npm) = npm() else { return };
    // Two servers listing the same tools, one of them also named by a goal tool: every clashing
    // name gets the server prefix.
    let a = McpServerConfig::Stdio(everything(&npm));
    let mut b = everything(&npm);
    b.name = "other".into();
    let reserved = ["get-sum".to_string()];
    let servers = McpServers::start_with(&[a, McpServerConfig::Stdio(b)], &reserved, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<String> = servers.tools().into_iter().map(|(t, _)| t.name).collect();
    assert!(names.contains(&"everything__echo".to_string()), "{names:?}");
    assert!(names.contains(&"other__echo".to_string()));
    assert!(!names.contains(&"echo".to_string()));
    assert!(
        names.contains(&"everything__get-sum".to_string()),
        "a goal tool's name is taken"
    );
    assert!(!names.contains(&"get-sum".to_string()));
    let ok = call(&servers, "other__echo", json!({"message": "x"})).await;
    assert_eq!(ok, Ok(json!("Echo: x")));
    servers.shutdown().await;
}

#[tokio::test]
async fn everything_over_streamable_http() {
    let Some(npm) = npm() else { return };
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        l.local_addr()
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let mut child = tokio::process::Command::new(npm.join(".bin/mcp-server-everything"))
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start the HTTP server: {e}"));
    let mut up = false;
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "server-everything did not listen on port {port}");
    let config: McpServerConfig = serde_json::from_value(json!({
        "name": "everything",
        "url": format!("http://127.0.0.1:{port}/mcp"),
        "headers": {"X-Dagloop-Test": "${DAGLOOP_MCP_TEST_HEADER}"},
        "from_env": ["DAGLOOP_MCP_TEST_HEADER"]
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: set before any thread of this test reads it; no other test uses this variable.
    unsafe { std::env::set_var("DAGLOOP_MCP_TEST_HEADER", "yes") };
    exercise_everything(config).await;
    let _ = child.kill().await;
}

#[tokio::test]
async fn filesystem_reads_writes_and_refuses_outside_paths() {
    let Some(npm) = npm() else { return };
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let root = dir.path().canonicalize().unwrap_or_else(|e| panic!("{e}"));
    let bin = npm.join(".bin/mcp-server-filesystem");
    let config = stdio("files", bin.to_string_lossy(), &[&root.to_string_lossy()]);
    let servers = McpServers::start(&[McpServerConfig::Stdio(config)])
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    let (write_tool, _) = find(&servers, "write_file");
    assert_eq!(
        write_tool.approval,
        Some(ToolApproval::Always),
        "destructiveHint asks"
    );
    let (read_tool, _) = find(&servers, "read_text_file");
    assert_eq!(read_tool.approval, None);
    assert!(is_read_only(&read_tool));

    let file = root.join("note.txt");
    let wrote = call(
        &servers,
        "write_file",
        json!({"path": file.to_string_lossy(), "content": "written by dagloop"}),
    )
    .await;
    assert!(wrote.is_ok(), "{wrote:?}");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap_or_default(),
        "written by dagloop"
    );
    let read = call(
        &servers,
        "read_text_file",
        json!({"path": file.to_string_lossy()}),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(read.to_string().contains("written by dagloop"), "{read}");

    let outside = call(&servers, "read_text_file", json!({"path": "/etc/hostname"})).await;
    let e = outside.expect_err("a path outside the allowed directory must be refused");
    assert_eq!(detail_code(&e).as_deref(), Some("mcp.tool_error"), "{e}");
    assert!(e.to_string().to_lowercase().contains("denied"), "{e}");
    servers.shutdown().await;
}

#[tokio::test]
async fn a_missing_command_fails_before_anything_runs() {
    let config = stdio("ghost", "/nonexistent/dagloop-no-such-mcp-server", &[]);
    let e = McpServers::start(&[McpServerConfig::Stdio(config)])
        .await
        .expect_err("a missing command must fail");
    assert_eq!(e.code(), "mcp.spawn_failed");
    assert_eq!(e.server(), "ghost");
    assert!(e.to_string().contains("`ghost`"), "{e}");
}

/// An `https://` server URL speaks TLS: the MCP client shares dagloop's rustls set-up, so the
/// first bytes a listener on loopback receives are a TLS handshake record (0x16), and the
/// server that answers them with garbage is a handshake error naming it.
#[tokio::test]
async fn an_https_server_url_speaks_tls() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let first = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.expect("accept");
        let mut buf = [0u8; 3];
        sock.read_exact(&mut buf).await.expect("read");
        let _ = sock.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await;
        buf
    });
    let config: McpServerConfig = serde_json::from_value(json!({
        "name": "secure", "url": format!("https://127.0.0.1:{port}/mcp"), "startup_timeout_s": 10
    }))
    .expect("config");
    let e = McpServers::start(&[config])
        .await
        .expect_err("garbage is no TLS server");
    assert_eq!(e.server(), "secure");
    let bytes = first.await.expect("listener");
    assert_eq!(bytes[0], 0x16, "a TLS handshake record, got {bytes:?}");
    assert_eq!(bytes[1], 0x03, "TLS major version 3, got {bytes:?}");
}

fn script(dir: &std::path::Path, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("server.sh");
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("{e}"));
    path.to_string_lossy().into_owned()
}

#[tokio::test]
async fn a_server_printing_garbage_is_a_handshake_error() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    // Exits after the garbage.
    let cmd = script(
        dir.path(),
        "echo 'Hello! I am not an MCP server'\necho oops >&2",
    );
    let e = McpServers::start(&[McpServerConfig::Stdio(stdio("noisy", cmd, &[]))])
        .await
        .expect_err("garbage must fail");
    assert_eq!(e.code(), "mcp.handshake", "{e}");
    assert_eq!(e.server(), "noisy");
    assert!(e.to_string().contains("stderr: oops"), "{e}");

    // Keeps running after the garbage: the startup limit ends the wait.
    let cmd = script(dir.path(), "echo '{not json'\nexec sleep 30");
    let mut cfg = stdio("stuck", cmd, &[]);
    cfg.startup_timeout_s = Some(2.0);
    let e = McpServers::start(&[McpServerConfig::Stdio(cfg)])
        .await
        .expect_err("garbage must fail");
    assert!(
        matches!(e, McpError::Handshake { .. } | McpError::Timeout { .. }),
        "{e}"
    );
    assert_eq!(e.server(), "stuck");
}

#[tokio::test]
async fn unlisted_environment_variables_are_refused() {
    let mut cfg = stdio("env", "/bin/true", &[]);
    cfg.env.insert("HOME_COPY".into(), "${HOME}".into());
    let e = McpServers::start(&[McpServerConfig::Stdio(cfg)])
        .await
        .expect_err("unlisted variable");
    assert_eq!(e.code(), "mcp.env_not_listed");
}

#[tokio::test]
async fn a_slow_call_times_out_and_the_server_keeps_working() {
    let Some(npm) = npm() else { return };
    let mut cfg = everything(&npm);
    cfg.timeout_s = Some(0.5);
    let servers = McpServers::start(&[McpServerConfig::Stdio(cfg)])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let slow = call(
        &servers,
        "trigger-long-running-operation",
        json!({"duration": 5, "steps": 5}),
    )
    .await;
    assert_eq!(slow, Err(ActivityError::Timeout { seconds: 0.5 }));
    let echo = call(&servers, "echo", json!({"message": "still here"})).await;
    assert_eq!(echo, Ok(json!("Echo: still here")));
    servers.shutdown().await;
}

#[tokio::test]
async fn a_server_killed_mid_run_is_restarted_on_the_next_call() {
    let Some(npm) = npm() else { return };
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let pidfile = dir.path().join("pid");
    let bin = npm.join(".bin/mcp-server-everything");
    let cmd = script(
        dir.path(),
        &format!(
            "echo $$ > '{}'\nexec '{}' stdio",
            pidfile.display(),
            bin.display()
        ),
    );
    let servers = McpServers::start(&[McpServerConfig::Stdio(stdio("everything", cmd, &[]))])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let first_pid = std::fs::read_to_string(&pidfile).unwrap_or_default();
    let first_pid = first_pid.trim().to_string();
    assert!(!first_pid.is_empty());

    let slow = call(
        &servers,
        "trigger-long-running-operation",
        json!({"duration": 10, "steps": 10}),
    );
    let kill = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let status = std::process::Command::new("kill")
            .args(["-9", &first_pid])
            .status();
        assert!(status.is_ok_and(|s| s.success()), "kill {first_pid}");
    };
    let (slow, ()) = tokio::join!(slow, kill);
    let e = slow.expect_err("the call in flight fails");
    assert_eq!(detail_code(&e).as_deref(), Some("mcp.server_died"), "{e}");

    let echo = call(&servers, "echo", json!({"message": "again"})).await;
    assert_eq!(echo, Ok(json!("Echo: again")));
    let second_pid = std::fs::read_to_string(&pidfile).unwrap_or_default();
    assert_ne!(second_pid.trim(), first_pid, "a new process answered");
    servers.shutdown().await;
}

#[tokio::test]
async fn the_mcp_files_example_goal_starts_its_server_and_its_calls_work() {
    let Some(npm) = npm() else { return };
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let root = dir.path().canonicalize().unwrap_or_else(|e| panic!("{e}"));
    let npm_root = npm.parent().map(|p| p.to_path_buf()).unwrap_or_default();
    // SAFETY: only this test reads these variables, and it sets them before starting anything.
    unsafe {
        std::env::set_var("DAGLOOP_MCP_NPM", &npm_root);
        std::env::set_var("DAGLOOP_MCP_FILES_DIR", &root);
    }
    let goal = dagloop::goal::Goal::load("examples/mcp-files/goal.json".as_ref())
        .unwrap_or_else(|e| panic!("{e}"));
    let (tools, activities, servers) = start_goal_servers(&goal).await;
    let write = tools.iter().find(|t| t.name == "write_file");
    assert_eq!(
        write.and_then(|t| t.approval),
        Some(ToolApproval::Never),
        "the goal's override wins over destructiveHint"
    );
    let mut registry = dagloop::tools::Registry::new();
    for (name, activity) in activities {
        registry.register(name, activity);
    }
    let run = |name: &str, params: Value| {
        let tool = tools.iter().find(|t| t.name == name).cloned();
        let tool = tool.unwrap_or_else(|| panic!("no tool {name}"));
        let mut c = Call::new(name);
        if let Value::Object(m) = params {
            c.params = m.into();
        }
        registry.run(&tool, Arc::new(c), serde_json::Map::new())
    };
    let wrote = run(
        "write_file",
        json!({"path": "notes.txt", "content": "oat milk"}),
    )
    .await;
    assert!(wrote.is_ok(), "{wrote:?}");
    let note = run("read_text_file", json!({"path": "notes.txt"})).await;
    // The example's output reads †state.note.content and †state.listing.content.
    assert_eq!(note.map(|o| o.value), Ok(json!({"content": "oat milk"})));
    let listing = run("list_directory", json!({"path": "."})).await;
    let listing = listing.map(|o| o.value).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        listing["content"]
            .as_str()
            .is_some_and(|s| s.contains("notes.txt")),
        "{listing}"
    );
    servers.shutdown().await;
}

#[test]
fn goal_files_with_bad_mcp_servers_are_invalid() {
    let goal = |servers: Value| {
        let text = json!({"goal": "g", "output_schema": {}, "mcp_servers": servers}).to_string();
        dagloop::goal::Goal::from_json(&text, "g.json".as_ref(), PathBuf::new())
    };
    let ok =
        goal(json!([{"name": "fs", "command": "srv"}, {"name": "web", "url": "http://h/mcp"}]));
    assert_eq!(
        ok.map(|g| g.mcp_servers.len()).map_err(|e| e.to_string()),
        Ok(2)
    );
    for (servers, needle) in [
        (
            json!([{"name": "fs", "command": "srv", "argz": []}]),
            "argz",
        ),
        (
            json!([{"name": "fs", "url": "http://h", "command": "x"}]),
            "command",
        ),
        (json!([{"name": "a b", "command": "srv"}]), "server name"),
        (json!([{"name": "web", "url": "ftp://h/mcp"}]), "http(s)"),
        (
            json!([{"name": "fs", "command": "a"}, {"name": "fs", "command": "b"}]),
            "two MCP",
        ),
    ] {
        let e = goal(servers).expect_err("must be refused");
        assert_eq!(e.code(), "goal.invalid");
        assert!(e.to_string().contains(needle), "{e}");
    }
}

/// The example runs from the command line: the filesystem server starts before the run, its
/// tools join the goal's, the scripted model writes, reads and lists a file.
#[test]
fn the_mcp_files_example_runs_from_the_command_line() {
    let Some(modules) = npm() else { return };
    let npm_root = modules.parent().expect("npm root").to_path_buf();
    let dir = tempfile::tempdir().expect("dir");
    let out = bin::dagloop()
        .args([
            "run",
            "examples/mcp-files/goal.json",
            "--json",
            "--no-store",
            // edit_file and move_file can ask a reviewer (never called): no terminal here.
            "--on-no-reviewer",
            "reject",
        ])
        .env("DAGLOOP_MCP_NPM", &npm_root)
        .env("DAGLOOP_MCP_FILES_DIR", dir.path())
        .output()
        .expect("dagloop");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(v["status"], "succeeded", "{v:#}");
    let tools: Vec<&str> = v["calls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["tool"].as_str())
        .collect();
    assert_eq!(tools, ["write_file", "read_text_file", "list_directory"]);
    assert!(
        dir.path().read_dir().expect("dir").count() >= 1,
        "the file was written"
    );
    // A server that cannot start is a clear error before anything runs.
    let out = bin::dagloop()
        .args([
            "run",
            "examples/mcp-files/goal.json",
            "--json",
            "--no-store",
        ])
        .env("DAGLOOP_MCP_NPM", "/nonexistent")
        .env("DAGLOOP_MCP_FILES_DIR", dir.path())
        .output()
        .expect("dagloop");
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["code"], "mcp.spawn_failed", "{v:#}");
}

/// A goal (and its scripted model) whose one call is the everything server's
/// `trigger-long-running-operation`, which sends a progress notification per step.
fn long_running_goal(dir: &std::path::Path, npm: &std::path::Path) -> PathBuf {
    let script = json!({"turns": [
        {"solution": {"calls": [{"_tool": "trigger-long-running-operation", "duration": 0.6,
                                 "steps": 3, "_outputPath": "†state.op"}], "output": null}},
        {"solution": {"calls": [], "output": {"op": "†state.op"}}}
    ]});
    let goal = json!({
        "goal": "run the long operation",
        "model": "scripted:long.script.json",
        "output_schema": {"type": "object"},
        "mcp_servers": [{"name": "everything", "args": ["stdio"], "approval": {"*": "never"},
            "command": npm.join(".bin/mcp-server-everything").to_string_lossy()}]
    });
    let write = |name: &str, v: &Value| {
        std::fs::write(dir.join(name), v.to_string()).unwrap_or_else(|e| panic!("{e}"))
    };
    write("long.script.json", &script);
    write("long.goal.json", &goal);
    dir.join("long.goal.json")
}

/// A run through the library: the server's progress notifications become live `call_progress`
/// events of the call, and the journal (hence replay) holds none of them.
#[tokio::test]
async fn mcp_progress_notifications_become_call_progress_events() {
    let Some(npm) = npm() else { return };
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let goal = dagloop::goal::Goal::load(&long_running_goal(dir.path(), &npm))
        .unwrap_or_else(|e| panic!("{e}"));
    let (tools, activities, servers) = start_goal_servers(&goal).await;
    let mut activities: std::collections::BTreeMap<_, _> = activities.into_iter().collect();
    let mut builder =
        dagloop::AgentBuilder::new(dagloop::RunDef::from_goal(goal).expect("defined"));
    for t in tools {
        if let Some(a) = activities.remove(&t.name) {
            builder = builder.tool(t, a);
        }
    }
    let h = builder.build().unwrap_or_else(|e| panic!("{e}")).start();
    let mut live = h.subscribe_from(0);
    let mut events = Vec::new();
    while let Some(e) = live.recv().await {
        events.push(e);
    }
    let r = h.wait().await;
    assert_eq!(r.status, dagloop::RunStatus::Succeeded, "{r:?}");
    let progress: Vec<(Option<dagloop::CallId>, f64, Option<f64>)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            dagloop::EventKind::CallProgress {
                progress, total, ..
            } => Some((e.call, *progress, *total)),
            _ => None,
        })
        .collect();
    assert!(
        progress
            .iter()
            .all(|(call, _, total)| *call == Some(dagloop::CallId(1)) && *total == Some(3.0)),
        "{progress:?}"
    );
    assert_progress_steps(&progress.iter().map(|p| p.1).collect::<Vec<_>>());
    // Between the call's start and its end.
    let names: Vec<&str> = events.iter().map(|e| e.kind.name()).collect();
    let first = names.iter().position(|n| *n == "call_progress");
    let last = names.iter().rposition(|n| *n == "call_progress");
    let started = names.iter().position(|n| *n == "started");
    let finished = names.iter().position(|n| *n == "finished");
    assert!(started < first && last < finished, "{names:?}");
    let mut late = h.subscribe_from(0);
    while let Some(e) = late.recv().await {
        assert_ne!(e.kind.name(), "call_progress", "replayed from the journal");
    }
    servers.shutdown().await;
}

/// The same through the binary: `--events FILE` keeps the progress events and the progress
/// view on stderr shows them.
#[test]
fn the_command_line_records_and_shows_mcp_progress() {
    let Some(npm) = npm() else { return };
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let goal = long_running_goal(dir.path(), &npm);
    let events = dir.path().join("events.jsonl");
    let out = bin::dagloop()
        .arg("run")
        .arg(&goal)
        .args(["--no-store", "--events"])
        .arg(&events)
        .output()
        .expect("dagloop");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let text = std::fs::read_to_string(&events).unwrap_or_else(|e| panic!("{e}"));
    let lines: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    let progress: Vec<&Value> = lines
        .iter()
        .filter(|v| v["type"] == "call_progress")
        .collect();
    let why = format!("events:\n{text}\nstderr:\n{stderr}");
    assert!(
        progress
            .iter()
            .all(|v| v["call_id"] == json!(1) && v["total"] == json!(3.0)),
        "{why}"
    );
    let steps: Vec<f64> = progress
        .iter()
        .filter_map(|v| v["progress"].as_f64())
        .collect();
    assert_progress_steps(&steps);
    let kinds: Vec<&str> = lines.iter().filter_map(|v| v["type"].as_str()).collect();
    assert_eq!(kinds.last(), Some(&"run_finished"), "the whole run: {why}");
    for step in ["1/3", "2/3"] {
        let line = format!("c1 trigger-long-running-operation progress {step}");
        assert!(stderr.contains(&line), "{why}");
    }
}

/// Issue 23: the filesystem server marks `write_file` `destructiveHint: true`, so a run of a goal
/// using it can ask a reviewer. Run with no terminal (stdin null), no `--decisions` and no
/// `--detach`, it refuses at start with `approval.no_reviewer`, naming the tool, instead of
/// waiting for a reviewer forever; told to reject what needs one, it runs.
#[test]
fn a_destructive_mcp_tool_with_no_reviewer_is_refused_at_start() {
    let Some(modules) = npm() else { return };
    let dir = tempfile::tempdir().expect("dir");
    let files = dir.path().join("files");
    std::fs::create_dir_all(&files).expect("files dir");
    let script = json!({"turns": [{"solution": {"calls": [], "output": {"done": true}}}]});
    std::fs::write(dir.path().join("answer.script.json"), script.to_string()).expect("script");
    let goal = json!({
        "goal": "Save a note.",
        "model": "scripted:answer.script.json",
        "output_schema": {"type": "object"},
        "mcp_servers": [{"name": "files", "timeout_s": 30,
            "command": modules.join(".bin/mcp-server-filesystem").to_string_lossy(),
            "args": [files.to_string_lossy()]}]
    });
    let path = dir.path().join("notes.goal.json");
    std::fs::write(&path, goal.to_string()).expect("goal");
    let run = |extra: &[&str]| {
        let mut cmd = bin::dagloop();
        cmd.args(["run", &path.to_string_lossy(), "--json", "--no-store"])
            .args(extra)
            .stdin(std::process::Stdio::null());
        let out = cmd.output().expect("dagloop");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{e}: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.code(), v)
    };
    let (code, v) = run(&[]);
    assert_eq!(code, Some(2), "{v:#}");
    assert_eq!(v["error"]["code"], "approval.no_reviewer", "{v:#}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("write_file"), "{message}");
    assert!(message.contains("--decisions"), "{message}");
    let (code, v) = run(&["--on-no-reviewer", "reject"]);
    assert_eq!(code, Some(0), "{v:#}");
    assert_eq!(v["status"], "succeeded", "{v:#}");
}

/// A server's param named with a leading `_` (a dagloop meta key, which calls may not carry) is
/// offered to the model under another name and restored when the tool is called.
#[tokio::test]
async fn a_param_named_like_a_meta_key_is_renamed_and_restored() {
    let Some(npm) = npm() else { return };
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/mcp/underscore-server.cjs"
    );
    let mut cfg = stdio("underscore", "node", &[script]);
    cfg.env
        .insert("NODE_PATH".into(), npm.to_string_lossy().into_owned());
    let servers = McpServers::start(&[McpServerConfig::Stdio(cfg)])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (tool, _) = find(&servers, "echo_args");
    let props = tool.schema["properties"].as_object().expect("properties");
    let names: Vec<&str> = props.keys().map(String::as_str).collect();
    // `p_tag` is taken by the server's own param, so `_tag` becomes `pp_tag`.
    assert_eq!(
        names,
        ["pp_tag", "p_tag", "text"],
        "{:#}",
        tool.schema["properties"]
    );
    assert_eq!(tool.schema["required"], json!(["pp_tag", "text"]));
    assert_eq!(tool.unknown_meta_key(), None);
    // What a model writes for it is a valid call ...
    let written =
        Call::parse(json!({"_tool": "echo_args", "pp_tag": "a", "p_tag": "b", "text": "hi"}))
            .unwrap_or_else(|e| panic!("{e}"));
    // ... and the server receives its own names.
    let echoed = call(&servers, "echo_args", written.params.into_value())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(echoed, json!({"_tag": "a", "p_tag": "b", "text": "hi"}));
    servers.shutdown().await;
}

/// A goal's MCP servers started as a library user starts them: its own tools' names kept clear,
/// then the tools they offer and their activities.
async fn start_goal_servers(
    goal: &dagloop::goal::Goal,
) -> (
    Vec<dagloop::protocol::Tool>,
    Vec<(String, std::sync::Arc<dyn dagloop::tools::Activity>)>,
    McpServers,
) {
    let reserved: Vec<String> = goal.tools.iter().map(|t| t.name.clone()).collect();
    let servers = McpServers::start_with(&goal.mcp_servers, &reserved, None)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", e.code()));
    let (tools, activities) = servers
        .tools()
        .into_iter()
        .map(|(t, a)| (t.clone(), (t.name, a)))
        .unzip();
    (tools, activities, servers)
}
