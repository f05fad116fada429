//! What a burst leaves in `dagloop serve` once its runs have parked (issue 46): the threads the
//! burst started go again, back to what a server that drove nothing holds plus a few; the
//! server drives none of them (`dagloop_runs_driven` is 0); and its memory comes back to a
//! fresh server's plus a constant.

#[path = "common/bin.rs"]
mod bin;
#[path = "common/serve.rs"]
mod serve;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;
use serve::{Server, client, counting_service, goal, rss_kib};

/// Threads of process `pid` now.
fn threads(pid: u32) -> u64 {
    serve::proc_status(pid, "Threads:")
}

/// What a burst may leave resident beyond a fresh server's memory: the code its requests ran
/// (paged in once), its threads' stacks and the store's caches. Before the allocator handed
/// idle threads' memory back, 300 parked runs left 50 to 160 MiB more than a fresh server;
/// now about 10.
const KEPT_KIB: u64 = 32 << 10;

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

/// 1,000 runs submitted by 32 clients at once, each waiting for a reviewer: the server never
/// has more blocking threads at once than its bound (each one it started left memory behind:
/// the memory kept grew with the burst); once the runs have all parked, its threads come back
/// down to its idle count plus a few (the blocking threads the burst started go; they used to
/// stay, each woken in turn by the watcher's polls before it could time out), it drives none
/// of them, and its resident memory comes back to
/// within [`KEPT_KIB`] of what it held before the burst (it used to keep 176 to 536 KiB per
/// run: src/cli/alloc.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_threads_and_memory_a_burst_took_go_once_its_runs_have_parked() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("runs.db");
    let (url, _) = counting_service().await;
    let s = Server::start(&store, None);
    let pid = s.child.id();
    let idle = threads(pid);
    // A fresh server's memory, once it has answered a request.
    let c = client();
    let _ = c.get(s.url("/metrics")).send().await.expect("metrics");
    let fresh = rss_kib(pid);
    let body = goal(dir.path(), &url, "ask");
    // The most threads the process has at once during the burst, sampled every 5 ms.
    let most = Arc::new(AtomicU64::new(0));
    let sampling = tokio::spawn({
        let most = most.clone();
        async move {
            loop {
                most.fetch_max(threads(pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    });
    // Enough runs that an unbounded blocking pool grows past its bound (135 to 281 threads at
    // once at 1,000 runs, in a debug build on 2 cores; 24 at 300).
    let n = 1000;
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
    sampling.abort();
    // The blocking threads the burst started are bounded (src/main.rs): each one leaves some
    // memory behind when it goes, so a burst that started one per run being submitted kept
    // memory in proportion to its size (4 KiB per run at 5,000 runs).
    let most = most.load(Ordering::Relaxed);
    let cap = dagloop::cli::max_blocking_threads() as u64;
    assert!(
        most <= idle + cap + 8,
        "{most} threads at once during the burst (idle: {idle}, blocking threads at most {cap})"
    );
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
    let metrics = c
        .get(s.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.lines().any(|l| l == "dagloop_runs_driven 0"),
        "the server still drives parked runs:\n{metrics}"
    );
    // Freed pages go back after the allocator's purge delay (10 s) once the threads collect.
    let bound = fresh + KEPT_KIB;
    let deadline = Instant::now() + Duration::from_secs(45);
    let mut rss = rss_kib(pid);
    while rss > bound && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        rss = rss_kib(pid);
    }
    assert!(
        rss <= bound,
        "{rss} KiB resident 45 s after {n} runs parked, against {fresh} KiB before the burst"
    );
}
