//! Issue 45: a run's record stays the truth for its MCP tools. A run parked while its MCP server
//! announced one list of tools, resumed when the server announces another (a tool added, or a
//! tool's schema changed), is refused with `run.definition_changed` naming the tools, its
//! record keeps the tools it started with (`show` reads them), and `--accept-changes` resumes
//! it under the new list. Through the binary, with a small MCP server in Python whose tool list
//! is a file the test rewrites.

#[path = "common/bin.rs"]
mod bin;

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{Value, json};

/// A stdio MCP server whose tools are read from the file named by its first argument on each
/// `tools/list`; every call answers `ok`.
const LISTED_SERVER: &str = r#"
import json, sys
tools_file = sys.argv[1]
def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    msg = json.loads(line)
    method, mid = msg.get("method"), msg.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": mid, "result": {
            "protocolVersion": msg["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "listed", "version": "1"}}})
    elif method == "tools/list":
        with open(tools_file) as f:
            send({"jsonrpc": "2.0", "id": mid, "result": {"tools": json.load(f)}})
    elif method == "tools/call":
        send({"jsonrpc": "2.0", "id": mid, "result": {
            "content": [{"type": "text", "text": "ok"}]}})
    elif mid is not None:
        send({"jsonrpc": "2.0", "id": mid, "result": {}})
"#;

fn python() -> bool {
    let ok = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("tests/mcp_resume.rs: SKIPPED (no python3)");
    }
    ok
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

fn dagloop(dir: &Path, args: &[&str]) -> Output {
    bin::dagloop()
        .current_dir(dir)
        .arg("--store")
        .arg(dir.join("runs.db"))
        .args(args)
        .output()
        .expect("dagloop")
}

fn poke(schema: Value) -> Value {
    json!({"name": "poke", "inputSchema": schema})
}

#[test]
fn a_resume_under_other_mcp_tools_is_refused_unless_the_changes_are_accepted() {
    if !python() {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    std::fs::write(d.join("server.py"), LISTED_SERVER).expect("server");
    let tools = d.join("tools.json");
    let first = json!([poke(json!({"type": "object"}))]);
    std::fs::write(&tools, first.to_string()).expect("tools");
    std::fs::write(
        d.join("m.json"),
        json!({"turns": [
            {"solution": {"calls": [{"_tool": "poke", "_outputPath": "†state.p"}], "output": null}},
            {"solution": {"calls": [], "output": {"poked": "†state.p"}}}
        ]})
        .to_string(),
    )
    .expect("model");
    std::fs::write(
        d.join("goal.json"),
        json!({"goal": "Poke.", "model": "scripted:m.json",
            "output_schema": {"type": "object", "required": ["poked"]},
            "mcp_servers": [{"name": "listed", "command": "python3",
                             "args": [d.join("server.py").display().to_string(),
                                      tools.display().to_string()]}]})
        .to_string(),
    )
    .expect("goal");
    let v = json_of(&dagloop(
        d,
        &["run", "goal.json", "--approve", "ask", "--detach", "--json"],
    ));
    assert_eq!(v["status"], "waiting", "{v}");
    let id = v["run_id"].as_str().expect("id").to_string();
    let call = v["awaiting"][0]["call_id"].as_u64().expect("call");
    let out = dagloop(d, &["decide", &id, &call.to_string(), "approve"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    for (now, named) in [
        // A tool added, and the tool the run calls with another schema.
        (
            json!([poke(json!({"type": "object"})), {"name": "wipe", "inputSchema": {"type": "object"}}]),
            "mcp tool wipe added",
        ),
        (
            json!([poke(json!({"type": "object", "required": ["force"]}))]),
            "mcp tool poke changed",
        ),
    ] {
        std::fs::write(&tools, now.to_string()).expect("tools");
        let out = dagloop(d, &["resume", &id, "--json", "--no-wait", "--detach"]);
        let v = json_of(&out);
        assert_eq!(v["error"]["code"], "run.definition_changed", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(named)),
            "{v}"
        );
        // Nothing ran, and the record still holds the tools the run started with.
        let shown = json_of(&dagloop(d, &["show", &id, "--json"]));
        assert_eq!(shown["status"], "waiting", "{shown}");
        let runs = json_of(&dagloop(d, &["runs", "--json"]));
        assert!(
            runs[0].get("owner").is_none(),
            "the lease was given back: {runs}"
        );
    }
    let record: Value = {
        let c = rusqlite::Connection::open(d.join("runs.db")).expect("sql");
        let text: String = c
            .query_row("SELECT record FROM runs WHERE id = ?1", [&id], |r| r.get(0))
            .expect("record");
        serde_json::from_str(&text).expect("json")
    };
    let recorded = &record["options"]["record"]["mcp_tools"];
    assert_eq!(recorded.as_array().map(Vec::len), Some(1), "{recorded}");
    assert_eq!(recorded[0]["_tool"], "poke", "{recorded}");
    assert!(
        recorded[0].get("required").is_none(),
        "the schema it started with: {recorded}"
    );

    // Accepted, the run goes on under the new list (one tool added) and records it.
    std::fs::write(
        &tools,
        json!([poke(json!({"type": "object"})), {"name": "wipe", "inputSchema": {"type": "object"}}])
            .to_string(),
    )
    .expect("tools");
    let v = json_of(&dagloop(
        d,
        &[
            "resume",
            &id,
            "--json",
            "--no-wait",
            "--detach",
            "--accept-changes",
        ],
    ));
    assert_eq!(v["status"], "succeeded", "{v}");
    let shown = json_of(&dagloop(d, &["show", &id, "--json"]));
    assert_eq!(shown["status"], "succeeded", "{shown}");
}
