//! `cargo bench --bench runs`: many runs in one process. 1,000 runs of the research example
//! (`examples/research`: three searches of 30–70 ms fanned out, a ranking, a latent draft, on
//! its scripted model) start at once on tokio's multi-thread runtime, as a server holding many
//! runs would. Prints runs/s, p50/p99 run latency, and the peak memory per concurrent run (a
//! counting global allocator), beside the same run alone in the same process (the baseline).
//! `DAGLOOP_BENCH_RUNS=N` changes the count.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use dagloop::goal::Goal;
use serde_json::json;

#[path = "support/alloc.rs"]
mod alloc;
#[path = "support/research.rs"]
mod research;

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or(0.0)
}

fn main() {
    // The allocator's options the `dagloop` binary runs with (src/cli/alloc.rs).
    dagloop::cli::tune_allocator();
    let n: usize = std::env::var("DAGLOOP_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/research/goal.json");
    let goal = Arc::new(Goal::load(&path).expect("the research goal"));
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    rt.block_on(async {
        // Warm-up, then the baseline: one run alone.
        research::run_once(goal.clone()).await;
        let mut alone = Vec::new();
        for _ in 0..5 {
            alone.push(research::run_once(goal.clone()).await);
        }
        alone.sort_by(f64::total_cmp);
        let base = alloc::live();
        alloc::reset_peak();
        let t0 = Instant::now();
        let tasks: Vec<_> = (0..n)
            .map(|_| tokio::spawn(research::run_once(goal.clone())))
            .collect();
        let mut lat = Vec::with_capacity(n);
        for t in tasks {
            lat.push(t.await.expect("run task"));
        }
        let wall = t0.elapsed().as_secs_f64();
        lat.sort_by(f64::total_cmp);
        let per_run = (alloc::peak() - base) as f64 / n as f64;
        println!(
            "{}",
            json!({
                "workload": "research_runs",
                "runs": n,
                "wall_s": round(wall),
                "runs_per_s": round(n as f64 / wall),
                "p50_ms": round(pct(&lat, 0.5)),
                "p99_ms": round(pct(&lat, 0.99)),
                "alone_p50_ms": round(pct(&alone, 0.5)),
                "peak_bytes_per_concurrent_run": per_run.round(),
            })
        );
    });
}
