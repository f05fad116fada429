//! The server on Temporal against the embedded server, for `benches/temporal.rs`: runs/s of
//! runs submitted through two `dagloop serve --engine temporal` (two `dagloop worker`s) and
//! through one embedded `dagloop serve`, and the median time from a call's `started` event (its
//! `at`) to its arrival at an SSE client (on the *other* server for Temporal).
//!
//! The workload is the server tests' two-call goal (`tests/common/serve.rs`), approved
//! automatically, its calls on a counting service on 127.0.0.1.

use std::time::{Duration, Instant};

use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{Value, json};

use super::bin;
use super::serve::{self, Server, client, counting_service};
use super::temporal::{DevServer, WorkerProcess};

fn now_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// Follows a run's events on `s` to `run_finished`: for each call's `started`, the ms from its
/// `at` to its arrival here.
async fn started_delays(s: &Server, id: &str) -> Vec<f64> {
    let r = client()
        .get(s.url(&format!("/runs/{id}/events")))
        .send()
        .await
        .expect("events");
    let mut stream = r.bytes_stream().eventsource();
    let mut out = Vec::new();
    while let Ok(Some(Ok(ev))) = tokio::time::timeout(Duration::from_secs(60), stream.next()).await
    {
        if ev.event == "started" {
            let data: Value = serde_json::from_str(&ev.data).unwrap_or_default();
            out.push(now_ms() - data["at"].as_f64().unwrap_or(0.0));
        }
        if ev.event == "run_finished" {
            break;
        }
    }
    out
}

async fn finished(s: &Server, id: &str) {
    let (st, v) = serve::send(client().get(s.url(&format!("/runs/{id}/result?wait=120")))).await;
    assert_eq!((st, v["status"].as_str()), (200, Some("succeeded")), "{v}");
}

/// `n` runs submitted alternately to `servers` (each waited for on the next one): runs/s; then
/// `followed` runs one at a time, each followed on the next server: the median delay.
async fn measure(servers: &[&Server], body: &Value, n: usize, followed: usize) -> (f64, f64) {
    let t0 = Instant::now();
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push((serve::create(servers[i % servers.len()], body).await, i));
    }
    let waits: Vec<_> = ids
        .iter()
        .map(|(id, i)| finished(servers[(i + 1) % servers.len()], id))
        .collect();
    futures::future::join_all(waits).await;
    let rps = n as f64 / t0.elapsed().as_secs_f64();
    let mut delays = Vec::new();
    for i in 0..followed {
        let id = serve::create(servers[i % servers.len()], body).await;
        delays.extend(started_delays(servers[(i + 1) % servers.len()], &id).await);
    }
    delays.sort_by(f64::total_cmp);
    (
        rps,
        delays.get(delays.len() / 2).copied().unwrap_or(f64::NAN),
    )
}

/// Prints the `servers` line.
pub async fn bench(dev: &DevServer, n: usize) {
    let dir = tempfile::tempdir().expect("dir");
    let (url, _counts) = counting_service().await;
    let body = serve::goal(dir.path(), &url, "auto");
    let w1 = WorkerProcess::start(bin::dagloop(), dev, "servers");
    let w2 = WorkerProcess::start(bin::dagloop(), dev, "servers");
    dev.wait_for_pollers("servers", &[&w1, &w2]);
    let on_temporal = |name: &str| {
        Server::start_with(&dir.path().join(name), None, |c| {
            c.current_dir(dir.path()).args([
                "--engine",
                "temporal",
                "--temporal",
                &dev.address,
                "--task-queue",
                "servers",
            ]);
        })
    };
    let (a, b) = (on_temporal("a.db"), on_temporal("b.db"));
    let embedded = Server::start(&dir.path().join("embedded.db"), None);
    // Warm-up.
    measure(&[&a, &b], &body, 2, 1).await;
    measure(&[&embedded], &body, 2, 1).await;
    let followed = 10;
    let (t_rps, t_delay) = measure(&[&a, &b], &body, n, followed).await;
    let (e_rps, e_delay) = measure(&[&embedded], &body, n, followed).await;
    let round = |x: f64| (x * 10.0).round() / 10.0;
    println!(
        "{}",
        json!({"workload": "servers", "runs": n, "temporal_servers": 2, "temporal_workers": 2,
               "temporal_runs_per_s": round(t_rps), "embedded_server_runs_per_s": round(e_rps),
               "temporal_started_to_sse_other_server_median_ms": round(t_delay),
               "embedded_started_to_sse_median_ms": round(e_delay)})
    );
}
