//! Issue 47 item 3, kept results on `dagloop serve --engine temporal` (feature `temporal`;
//! without `DAGLOOP_TEMPORAL` the test prints SKIPPED): the run's `kept_result_bytes` bounds
//! what a worker hands back, as the embedded engine bounds what its driver keeps
//! (`tests/result_bound.rs`). A 50 MiB response streamed to a run bounded to 1 MiB is read by
//! the worker no further than the run can keep — the service sees the connection closed after
//! a few MiB — and comes back as a `run.result_bound` failure with the size, SHA-256 and first
//! characters of what was read; the results within the bound are kept as they were; the
//! workflow's history stays under the bound (the result never entered it whole); and the run
//! as either server describes it agrees.
#![cfg(feature = "temporal")]

#[path = "common/bin.rs"]
mod bin;
#[path = "common/blob.rs"]
mod blob;
#[path = "common/cluster.rs"]
mod cluster;
#[path = "common/serve.rs"]
mod serve;
#[path = "common/temporal.rs"]
mod temporal;

use std::sync::atomic::Ordering;

use blob::{assert_bound_record, blob_service, blob_tool};
use serde_json::json;
use serve::{call_of, client, send};

const BOUND: u64 = 1024 * 1024;
const BIG: usize = 50 * 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_over_the_runs_bound_leaves_the_worker_as_its_size_and_hash() {
    let (port, sent) = blob_service().await;
    let scripts = tempfile::tempdir().expect("tmp");
    let config = json!({
        "grants": {"tools": ["http"], "kept_result_bytes": BOUND,
                   "files": [scripts.path().display().to_string()],
                   "egress": {"hosts": ["127.0.0.1"], "ports": [port]}}});
    // The workers run under the servers' config: they grant the blob service too.
    let Some(c) = cluster::cluster_full(Some(config), &[], true).await else {
        return;
    };
    let script = scripts.path().join("s.json");
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
        "tools": [blob_tool("small", port, 30), blob_tool("big", port, BIG / 1024),
                  blob_tool("after", port, 30)]});
    let id = serve::create(&c.a, &goal).await;
    let (st, v) = send(client().get(c.b.url(&format!("/runs/{id}/result?wait=120")))).await;
    assert_eq!((st, v["status"].as_str()), (200, Some("succeeded")), "{v}");
    let (st, run) = send(client().get(c.a.url(&format!("/runs/{id}")))).await;
    assert_eq!(st, 200, "{run}");
    // Within the bound: kept as it was.
    assert_eq!(call_of(&run, "small")["status"], "done");
    assert_eq!(call_of(&run, "after")["status"], "done");
    // Over it: read no further than the run could keep.
    let e = &call_of(&run, "big")["error"];
    assert_bound_record(e, BOUND);
    // The service saw the connection closed early: a few MiB left it, not 50.
    assert!(
        sent.cut.load(Ordering::SeqCst),
        "the 50 MiB body was read to its end"
    );
    let out = sent.bytes.load(Ordering::SeqCst);
    assert!(out < 16 * 1024 * 1024, "{out} bytes were sent");
    // The workflow's history holds what was kept: under the bound, plus the run's own events.
    let history = c
        .dev
        .connect()
        .await
        .history_json(&id)
        .await
        .expect("history");
    assert!(
        (history.len() as u64) < BOUND + 256 * 1024,
        "a history of {} bytes",
        history.len()
    );
    // The other server describes the same run.
    let (_, other) = send(client().get(c.b.url(&format!("/runs/{id}")))).await;
    assert_eq!(call_of(&other, "big")["error"], *e);
    let _ = &c.workers;
}
