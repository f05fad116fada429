//! `cargo bench --features temporal --bench temporal`: the research example (`examples/research`:
//! three searches of 30–70 ms fanned out, a ranking, a latent draft, on its scripted model)
//! embedded and on Temporal, on this machine, against Temporal's development server
//! (`DAGLOOP_TEMPORAL`, from `scripts/setup-temporal.sh`).
//!
//! Prints, as JSON lines: the makespan of one run (median of 7) embedded and on Temporal, with
//! their ratio; and runs/s over 100 runs started at once, with two workers on Temporal and
//! embedded in one process (the baseline). `DAGLOOP_BENCH_RUNS=N` changes the count. Then the
//! server on Temporal (`support/servers.rs`): runs/s through two servers and two workers and the
//! median from a call's `started` to its SSE event on the other server, beside one embedded
//! server's (`DAGLOOP_BENCH_SERVER_RUNS=N`, default 50).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use dagloop::goal::Goal;
use dagloop::runs::RunOptions;
use dagloop::temporal::{Connection, RunSpec, WorkerOptions};
use serde_json::json;

#[path = "../tests/common/bin.rs"]
mod bin;
#[path = "support/research.rs"]
mod research;
#[path = "../tests/common/serve.rs"]
mod serve;
#[path = "support/servers.rs"]
mod servers;
#[path = "../tests/common/temporal.rs"]
mod temporal;

async fn on_temporal(conn: Connection, goal: Arc<Goal>, id: String, queue: &str) -> f64 {
    let t = Instant::now();
    conn.start(
        RunSpec::new(id.clone(), &goal, RunOptions::default()),
        queue,
    )
    .await
    .expect("start");
    let r = conn.result(&id).await.expect("result");
    assert!(r.succeeded(), "{:?}", r.error);
    t.elapsed().as_secs_f64() * 1000.0
}

/// A worker with the research tools, on a thread and runtime of its own (its future is not
/// `Send`), until `stop` fires.
fn worker(
    address: String,
    queue: &str,
) -> (
    tokio::sync::oneshot::Sender<()>,
    std::thread::JoinHandle<()>,
) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let opts = WorkerOptions {
        address,
        namespace: "default".into(),
        task_queue: queue.into(),
        access: Default::default(),
        webhook: None,
    };
    let h = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let mut registry = dagloop::tools::Registry::new();
        research::tools::register(&mut registry);
        let _ = rt.block_on(dagloop::temporal::run_worker(&opts, registry, async {
            let _ = rx.await;
        }));
    });
    (tx, h)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let Some(server) = temporal::DevServer::start() else {
        println!("SKIPPED: DAGLOOP_TEMPORAL is not set (scripts/setup-temporal.sh prints it)");
        return;
    };
    let n: usize = std::env::var("DAGLOOP_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/research/goal.json");
    let goal = Arc::new(Goal::load(&path).expect("the research goal"));
    let round = |x: f64| (x * 10.0).round() / 10.0;
    let workers = [
        worker(server.address.clone(), "bench"),
        worker(server.address.clone(), "bench"),
    ];
    rt.block_on(async {
        let conn = server.connect().await;
        // Warm-up (both engines), then one run at a time.
        research::run_once(goal.clone()).await;
        on_temporal(conn.clone(), goal.clone(), "warm".into(), "bench").await;
        let mut e = Vec::new();
        let mut t = Vec::new();
        for i in 0..7 {
            e.push(research::run_once(goal.clone()).await);
            t.push(on_temporal(conn.clone(), goal.clone(), format!("one-{i}"), "bench").await);
        }
        let (e, t) = (median(e), median(t));
        println!(
            "{}",
            json!({"workload": "research_makespan", "embedded_ms": round(e), "temporal_ms": round(t),
                   "ratio": round(t / e * 100.0) / 100.0})
        );
        let t0 = Instant::now();
        let runs: Vec<_> = (0..n)
            .map(|i| tokio::spawn(on_temporal(conn.clone(), goal.clone(), format!("many-{i}"), "bench")))
            .collect();
        for r in runs {
            r.await.expect("run");
        }
        let temporal_rps = n as f64 / t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        let runs: Vec<_> = (0..n).map(|_| tokio::spawn(research::run_once(goal.clone()))).collect();
        for r in runs {
            r.await.expect("run");
        }
        let embedded_rps = n as f64 / t0.elapsed().as_secs_f64();
        println!(
            "{}",
            json!({"workload": "research_runs", "runs": n, "temporal_workers": 2,
                   "temporal_runs_per_s": round(temporal_rps), "embedded_runs_per_s": round(embedded_rps)})
        );
    });
    for (stop, h) in workers {
        let _ = stop.send(());
        let _ = h.join();
    }
    let n: usize = std::env::var("DAGLOOP_BENCH_SERVER_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    rt.block_on(servers::bench(&server, n));
}
