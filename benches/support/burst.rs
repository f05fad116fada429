//! The rows of `cargo bench --bench server` for issue 46: what a burst of runs leaves in a
//! server once they have all parked, beside a server restarted on the same store; and how long
//! a run whose server was killed (SIGKILL) mid-call waits until another server on the same host
//! drives it again.
//!
//! `DAGLOOP_BENCH_BURST` sets the burst's size (default 5,000); `DAGLOOP_BENCH_IDLE_S` how long
//! the server idles after it (default 60 s).

use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};

/// Resident memory (KiB) and threads of process `pid`.
fn rss_and_threads(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("Threads:"))
}

fn parked(store: &Path) -> i64 {
    rusqlite::Connection::open(store)
        .and_then(|c| {
            c.query_row("SELECT count(*) FROM runs WHERE parked = 1", [], |r| {
                r.get(0)
            })
        })
        .unwrap_or(0)
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// N runs that each wait for a reviewer, submitted by 16 clients at once; once all have parked
/// and the server idled, its RSS and threads, then those of a server restarted on that store.
pub async fn burst(c: &reqwest::Client, dir: &Path, ask: &Value) {
    let n = env_or("DAGLOOP_BENCH_BURST", 5_000) as usize;
    let idle = Duration::from_secs(env_or("DAGLOOP_BENCH_IDLE_S", 60));
    let sub = dir.join("burst");
    std::fs::create_dir_all(&sub).expect("dir");
    let store = sub.join("runs.db");
    let server = super::start_at(dir, &store);
    let pid = server.child.id();
    let (rss0, threads0) = rss_and_threads(pid);
    let t = Instant::now();
    let base = server.base.clone();
    futures::stream::iter(0..n)
        .map(|_| {
            let (c, base, ask) = (c.clone(), base.clone(), ask.clone());
            async move {
                c.post(format!("{base}/runs"))
                    .json(&ask)
                    .send()
                    .await
                    .expect("post");
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    let (rss_peak, threads_peak) = rss_and_threads(pid);
    while parked(&store) < n as i64 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let parked_after = t.elapsed();
    tokio::time::sleep(idle).await;
    let (rss_idle, threads_idle) = rss_and_threads(pid);
    drop(server);
    let again = super::start_at(dir, &store);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (rss_restarted, threads_restarted) = rss_and_threads(again.child.id());
    drop(again);
    println!(
        "burst runs={n} parked_after_s={:.1} idle_s={} rss_kib: empty={rss0} after_submit={rss_peak} after_idle={rss_idle} restarted={rss_restarted} kib_per_run_kept={:.2} threads: empty={threads0} after_submit={threads_peak} after_idle={threads_idle} restarted={threads_restarted}",
        parked_after.as_secs_f64(),
        idle.as_secs(),
        rss_idle.saturating_sub(rss_restarted) as f64 / n as f64,
    );
}

/// A run whose server is killed (SIGKILL) while its call is in flight: the time from the kill
/// to another server on the same store (this host) holding the run's lease and driving it,
/// that server's start included (the lease itself runs for 20 s more).
pub async fn takeover(c: &reqwest::Client, dir: &Path) {
    // A tool service that never answers: the call stays in flight.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    let script = dir.join("takeover.json");
    std::fs::write(
        &script,
        json!({"turns": [{"solution": {"calls": [{"_tool": "hang"}], "output": null}},
                         {"solution": {"calls": [], "output": {}}}]})
        .to_string(),
    )
    .expect("script");
    let goal = json!({"goal": "hang", "model": format!("scripted:{}", script.display()),
        "output_schema": {"type": "object"},
        "tools": [{"_tool": "hang", "_activity": "http", "_idempotent": true,
            "_http": {"method": "POST", "url": format!("http://127.0.0.1:{port}/")},
            "type": "object"}]});
    let sub = dir.join("takeover");
    std::fs::create_dir_all(&sub).expect("dir");
    let store = sub.join("runs.db");
    let mut times = Vec::new();
    for _ in 0..5 {
        let a = super::start_at(dir, &store);
        let r: Value = c
            .post(format!("{}/runs", a.base))
            .json(&goal)
            .send()
            .await
            .expect("post")
            .json()
            .await
            .expect("json");
        let id = r["id"].as_str().expect("id").to_string();
        // Wait until the call is in flight.
        loop {
            let v: Value = c
                .get(format!("{}/runs/{id}", a.base))
                .send()
                .await
                .expect("get")
                .json()
                .await
                .expect("json");
            if v["calls"].as_array().is_some_and(|cs| !cs.is_empty()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let t = Instant::now();
        drop(a); // SIGKILL
        let b = super::start_at(dir, &store);
        loop {
            let v: Value = c
                .get(format!("{}/runs/{id}", b.base))
                .send()
                .await
                .expect("get")
                .json()
                .await
                .expect("json");
            if v["status"] == "running" {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(60), "never taken over");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        times.push(t.elapsed());
        // Cancel the run so that the next server does not take it over too.
        let _ = c
            .post(format!("{}/runs/{id}/cancel", b.base))
            .json(&json!({}))
            .send()
            .await;
        drop(b);
    }
    times.sort();
    println!(
        "takeover kill_to_driven_ms: median={:.0} min={:.0} max={:.0} (5 kills; another server on the same host, its start included)",
        times[2].as_secs_f64() * 1000.0,
        times[0].as_secs_f64() * 1000.0,
        times[4].as_secs_f64() * 1000.0,
    );
}
