//! What a burst leaves in `dagloop serve` once its runs have parked (issue 46): the threads the
//! burst started go again, back to what a server that drove nothing holds plus a few.

#[path = "common/bin.rs"]
mod bin;
#[path = "common/serve.rs"]
mod serve;

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;
use serve::{Server, client, counting_service, goal};

/// Threads of process `pid` now.
fn threads(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// How many of the store's runs are parked.
fn parked(store: &std::path::Path) -> i64 {
    rusqlite::Connection::open(store)
        .and_then(|c| {
            c.query_row("SELECT count(*) FROM runs WHERE parked = 1", [], |r| {
                r.get(0)
            })
        })
        .unwrap_or(0)
}

/// 300 runs submitted by 32 clients at once, each waiting for a reviewer: once they have all
/// parked, the server's threads come back down to its idle count plus a few (the blocking
/// threads the burst started go; they used to stay, each woken in turn by the watcher's polls
/// before it could time out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_threads_a_burst_started_go_once_its_runs_have_parked() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("runs.db");
    let (url, _) = counting_service().await;
    let s = Server::start(&store, None);
    let pid = s.child.id();
    let idle = threads(pid);
    let body = goal(dir.path(), &url, "ask");
    let c = client();
    let n = 300;
    let posts = futures::stream::iter(0..n)
        .map(|_| {
            let c = c.clone();
            let body = body.clone();
            let runs = s.url("/runs");
            async move {
                let r = c.post(runs).json(&body).send().await.expect("post");
                assert_eq!(r.status().as_u16(), 201);
                r.json::<Value>().await.expect("json")
            }
        })
        .buffer_unordered(32);
    let made: Vec<Value> = posts.collect().await;
    assert_eq!(made.len(), n);
    let deadline = Instant::now() + Duration::from_secs(120);
    while parked(&store) < n as i64 {
        assert!(Instant::now() < deadline, "the runs never all parked");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let peak = threads(pid);
    let bound = idle + 8;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut now = peak;
    while now > bound && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        now = threads(pid);
    }
    assert!(
        now <= bound,
        "{now} threads 20 s after the burst (idle: {idle}, after the burst: {peak})"
    );
}
