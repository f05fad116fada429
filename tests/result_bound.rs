//! Issue 47 item 3, kept results: a run keeps at most the operator's `kept_result_bytes` of tool
//! results. Through the real binary (`dagloop serve` under an operator config, then `dagloop
//! show` and `runs --stats` on its store): a 50 MiB result in a run bounded to 1 MiB is kept as a
//! `run.result_bound` failure with the result's size, SHA-256 and first characters; the results
//! within the bound are kept as they were; the store's journal stays under the bound; and a
//! replay of the stored run (`show`) says what the live run said.

#[path = "common/bin.rs"]
mod bin;
#[path = "common/serve.rs"]
mod serve;

use std::path::Path;

use serde_json::{Value, json};
use serve::{Server, client, send, until};

const BOUND: u64 = 1024 * 1024;
const BIG: usize = 50 * 1024 * 1024;

/// A service answering `/blob?kib=N` with a JSON string of N KiB.
async fn blob_service() -> u16 {
    let app = axum::Router::new().route(
        "/blob",
        axum::routing::get(
            |q: axum::extract::Query<std::collections::BTreeMap<String, usize>>| async move {
                let n = q.get("kib").copied().unwrap_or(1) * 1024;
                axum::Json(Value::String("b".repeat(n)))
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

fn blob_tool(name: &str, port: u16, kib: usize) -> Value {
    json!({"_tool": name, "_activity": "http",
        "_http": {"method": "GET", "url": format!("http://127.0.0.1:{port}/blob?kib={kib}"),
                  "max_bytes": 64 * 1024 * 1024},
        "type": "object", "properties": {}})
}

fn call_of<'a>(run: &'a Value, tool: &str) -> &'a Value {
    run["calls"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["tool"] == tool))
        .unwrap_or_else(|| panic!("no call of {tool}"))
}

fn dagloop_json(store: &Path, args: &[&str]) -> Value {
    let out = bin::dagloop()
        .arg("--store")
        .arg(store)
        .args(args)
        .output()
        .expect("dagloop");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "not JSON: {} {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_over_the_runs_bound_is_kept_as_its_size_and_hash() {
    let dir = tempfile::tempdir().expect("tmp");
    let port = blob_service().await;
    let cfg = dir.path().join("dagloop.toml");
    std::fs::write(
        &cfg,
        format!(
            "[grants]\nkept_result_bytes = {BOUND}\nfiles = [\"{}\"]\n\
             [grants.egress]\nhosts = [\"127.0.0.1\"]\nports = [{port}]\n",
            dir.path().display()
        ),
    )
    .expect("config");
    let store = dir.path().join("runs.db");
    let s = Server::start_config(&store, &cfg, None, |c| {
        c.current_dir(dir.path());
    });
    let script = dir.path().join("s.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"solution": {"calls": [{"_tool": "small"}], "output": null}},
            {"solution": {"calls": [{"_tool": "big"}], "output": null}},
            {"solution": {"calls": [{"_tool": "after"}], "output": null}},
            {"solution": {"calls": [], "output": {"done": true}}}
        ]})
        .to_string(),
    )
    .expect("script");
    let goal = json!({"goal": "fetch blobs", "model": format!("scripted:{}", script.display()),
        "output_schema": {"type": "object"},
        "tools": [blob_tool("small", port, 300), blob_tool("big", port, BIG / 1024),
                  blob_tool("after", port, 300)]});
    let (st, v) = send(client().post(s.url("/runs")).json(&goal)).await;
    assert_eq!(st, 201, "{v}");
    let id = v["id"].as_str().expect("id").to_string();
    let run = until(&s, &id, |v| {
        !matches!(v["status"].as_str(), Some("running" | "stopped"))
    })
    .await;
    assert_eq!(run["status"], "succeeded", "{}", run["status"]);
    // Within the bound: kept as it was.
    assert_eq!(call_of(&run, "small")["status"], "done");
    assert_eq!(call_of(&run, "after")["status"], "done");
    // Over it: the run was told, and keeps the result's size, hash and head only.
    let big = call_of(&run, "big");
    assert_eq!(big["status"], "error");
    let e = &big["error"];
    assert_eq!(e["code"], "run.result_bound", "{e}");
    assert_eq!(e["details"]["bytes"], json!(BIG + 2));
    assert_eq!(e["details"]["bound"], json!(BOUND));
    assert_eq!(e["details"]["sha256"].as_str().map(str::len), Some(64));
    assert!(
        e["details"]["head"]
            .as_str()
            .is_some_and(|h| h.len() == 1024 && h.starts_with("\"bbb"))
    );
    drop(s);
    // The store holds what was kept: under the bound (plus the run's own entries).
    let stats = dagloop_json(&store, &["runs", "--stats", "--json"]);
    let journal = stats["journal_bytes"].as_u64().expect("journal_bytes");
    assert!(
        journal < BOUND + 64 * 1024,
        "journal of {journal} bytes: {stats}"
    );
    // A replay of the stored run says what the live run said.
    let shown = dagloop_json(&store, &["show", &id, "--json"]);
    assert_eq!(shown["status"], "succeeded");
    assert_eq!(call_of(&shown, "big")["error"], *e);
    assert_eq!(call_of(&shown, "small")["status"], "done");
}
