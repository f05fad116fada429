//! Issue 47 item 3, kept results: a run keeps at most the operator's `kept_result_bytes` of tool
//! results. Through the real binary (`dagloop serve` under an operator config, then `dagloop
//! show` and `runs --stats` on its store): a 50 MiB response streamed to a run bounded to 1 MiB
//! (its tool's `_http.max_bytes` 64 MiB) is read no further than the run can keep — the service
//! sees the connection closed after a few MiB, the server's peak memory does not grow by the
//! response — and is kept as a `run.result_bound` failure with the size, SHA-256 and first
//! characters of what was read; the results within the bound are kept as they were; the store's
//! journal stays under the bound; and a replay of the stored run (`show`) says what the live run
//! said.

#[path = "common/bin.rs"]
mod bin;
#[path = "common/blob.rs"]
mod blob;
#[path = "common/serve.rs"]
mod serve;

use std::path::Path;
use std::sync::atomic::Ordering;

use blob::{assert_bound_record, blob_service, blob_tool};
use serde_json::{Value, json};
use serve::{Server, client, send, until};

const BOUND: u64 = 1024 * 1024;
const BIG: usize = 50 * 1024 * 1024;

/// The process's peak resident memory so far (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmHWM")
        * 1024
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
async fn a_result_over_the_runs_bound_is_read_no_further_and_kept_as_its_size_and_hash() {
    let dir = tempfile::tempdir().expect("tmp");
    let (port, sent) = blob_service().await;
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
    let goal = |small_kib: usize, big_kib: usize| {
        json!({"goal": "fetch blobs", "model": format!("scripted:{}", script.display()),
            "output_schema": {"type": "object"},
            "tools": [blob_tool("small", port, small_kib), blob_tool("big", port, big_kib),
                      blob_tool("after", port, small_kib)]})
    };
    // A first run with nothing big: the server's memory once it has run such a run.
    let (st, v) = send(client().post(s.url("/runs")).json(&goal(30, 1))).await;
    assert_eq!(st, 201, "{v}");
    let warm = v["id"].as_str().expect("id").to_string();
    until(&s, &warm, |v| {
        !matches!(v["status"].as_str(), Some("running" | "stopped"))
    })
    .await;
    let journal_of = |stats: &Value| stats["journal_bytes"].as_u64().expect("journal_bytes");
    let warm_journal = journal_of(&dagloop_json(&store, &["runs", "--stats", "--json"]));
    let goal = goal(30, BIG / 1024);
    let peak_before = peak_rss(s.child.id());
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
    // Over it: read no further than the run could keep, the rest never asked for.
    let big = call_of(&run, "big");
    assert_eq!(big["status"], "error");
    let e = &big["error"];
    assert_bound_record(e, BOUND);
    // The service saw the connection closed early: a few MiB left it, not 50.
    let out = sent.bytes.load(Ordering::SeqCst);
    assert!(
        sent.cut.load(Ordering::SeqCst),
        "the 50 MiB body was read to its end"
    );
    assert!(out < 16 * 1024 * 1024, "{out} bytes were sent");
    // The server never held the response: its peak memory grew by less than 50 MiB (holding
    // it, as before, took the body, its text and its JSON value: over 150 MiB).
    let grew = peak_rss(s.child.id()).saturating_sub(peak_before);
    assert!(grew < 40 * 1024 * 1024, "peak memory grew by {grew} bytes");
    drop(s);
    // The store holds what was kept: under the bound (plus the run's own entries).
    let stats = dagloop_json(&store, &["runs", "--stats", "--json"]);
    let journal = journal_of(&stats) - warm_journal;
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
