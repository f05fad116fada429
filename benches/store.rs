//! The run store's cost on the path users run (`cargo bench --bench store`), JSON lines:
//! - journal entries per second, one commit per entry and batched;
//! - makespan of a 1,000-call zero-latency fan-out with the store on versus off, run the way
//!   `dagloop run` runs it (`runs::prepare`, the op poller, and with the store the run's end
//!   recorded with `synchronous=FULL` before the result counts), alternating off and on; each
//!   store-on figure is printed beside the store-off figure of the same rounds;
//! - time to rebuild a run with 10,000+ journal entries (load from SQLite, replay).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use dagloop::context::SanitizeLimits;
use dagloop::engine::JournalSink;
use dagloop::machine::{JournalEntry, RunInput, replay};
use dagloop::runs::{Review, RunOptions};
use dagloop::store::{RunStore, SqliteStore};
use dagloop::{Goal, Policy, Registry};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// The fan-out goal in `dir`, its scripted model answering with `n` independent calls.
fn goal(dir: &Path, n: usize) -> Goal {
    let calls: Vec<Value> = (0..n)
        .map(|i| json!({"_tool": "t", "i": i, "_outputPath": format!("†state.r{i}")}))
        .collect();
    let script = json!({"turns": [
        {"solution": {"calls": calls, "output": null}, "chunk_chars": 4096},
        {"solution": {"calls": [], "output": {"done": true}}}
    ]});
    let name = format!("fan-{n}.json");
    std::fs::write(dir.join(&name), script.to_string()).expect("script");
    Goal::from_json(
        &json!({"goal": "fan-out", "model": format!("scripted:{name}"),
            "output_schema": {"type": "object"},
            "tools": [{"_tool": "t", "_activity": "rust", "type": "object"}]})
        .to_string(),
        &dir.join("goal.json"),
        dir.to_path_buf(),
    )
    .expect("goal")
}

struct Timing {
    /// From start to the result.
    run_ms: f64,
    /// Recording the result (`synchronous=FULL`); 0 without a store.
    finish_ms: f64,
    id: String,
}

impl Timing {
    fn total(&self) -> f64 {
        self.run_ms + self.finish_ms
    }
}

/// One run as `dagloop run GOAL` makes it (auto policy, no reviewer), with or without the store.
async fn fan_out(dir: &Path, n: usize, store: Option<Arc<SqliteStore>>) -> Timing {
    let mut registry = Registry::new();
    registry.register_fn(
        "t",
        |p: Value| async move { Ok::<_, String>(p["i"].clone()) },
    );
    let def = dagloop::runs::define(
        goal(dir, n),
        RunOptions::default(),
        Arc::new(dagloop::grants::Grants::open()),
    )
    .expect("define");
    let prepared = dagloop::runs::prepare(
        registry,
        &def,
        None,
        Review::External,
        CancellationToken::new(),
        dagloop::runs::Host {
            store: store
                .clone()
                .map(|s| s as Arc<dyn dagloop::store::RunStore>),
            sink: None,
            mcp: None,
            ..Default::default()
        },
    )
    .await
    .expect("prepare");
    let id = prepared.run_id().to_string();
    let t0 = Instant::now();
    let launched = prepared.start().await.expect("start");
    let poller = store
        .clone()
        .map(|s| dagloop::runs::spawn_op_poller(&launched.handle, s, |_| {}));
    let r = launched.handle.wait().await;
    let run_ms = t0.elapsed().as_secs_f64() * 1000.0;
    if let Some(p) = poller {
        p.abort();
    }
    assert!(r.succeeded(), "{r:?}");
    let t1 = Instant::now();
    if let Some(s) = &store {
        s.finish(&id, &r).expect("finish");
    }
    Timing {
        run_ms,
        finish_ms: t1.elapsed().as_secs_f64() * 1000.0,
        id,
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("dir");
    rt.block_on(async {
        let store = Arc::new(SqliteStore::open(&dir.path().join("bench.db")).expect("store"));
        // Entries per second.
        let entry = |seq: u64| JournalEntry {
            seq,
            at: seq,
            input: RunInput::Outcome {
                call: dagloop::CallId(seq),
                outcome: dagloop::scheduler::Outcome::ok(json!({"v": seq})),
            },
        };
        for (label, batch, total) in [("one_per_commit", 1u64, 2_000u64), ("batched_256", 256, 50_000)] {
            // A journal is appended only for a run the store holds, by the owner of its lease.
            store
                .create(&dagloop::store::RunRecord {
                    id: format!("bench-{label}"),
                    created_at: 0,
                    goal: json!({}),
                    base_dir: ".".into(),
                    options: json!({}),
                })
                .expect("create");
            let t0 = Instant::now();
            let mut seq = 0;
            while seq < total {
                let entries: Vec<JournalEntry> = (0..batch).map(|i| entry(seq + i + 1)).collect();
                seq += batch;
                store.append(&format!("bench-{label}"), &entries).await.expect("append");
            }
            let s = t0.elapsed().as_secs_f64();
            println!("{}", json!({"workload": "journal_append", "mode": label, "entries": total,
                "entries_per_s": (total as f64 / s).round()}));
        }
        // Fan-out with the store off and on, alternating (three warm-up rounds, then 25 each:
        // on a shared machine fewer rounds give medians that move by 10%).
        let n = 1000;
        let (mut off, mut on, mut run_on, mut finish) = (vec![], vec![], vec![], vec![]);
        // Each round's on/off ratio: a burst of load from elsewhere slows both halves of a
        // round, so the median of these moves less than the ratio of the two medians.
        let mut paired = vec![];
        for round in 0..28 {
            let a = fan_out(dir.path(), n, None).await;
            let b = fan_out(dir.path(), n, Some(store.clone())).await;
            if round >= 3 {
                paired.push(b.total() / a.total());
                off.push(a.total());
                on.push(b.total());
                run_on.push(b.run_ms);
                finish.push(b.finish_ms);
            }
        }
        let (best_off, best_on) = (
            off.iter().copied().fold(f64::MAX, f64::min),
            on.iter().copied().fold(f64::MAX, f64::min),
        );
        let (med_off, med_on) = (median(&mut off), median(&mut on));
        println!("{}", json!({"workload": "fanout0_store", "n": n, "rounds": on.len(),
            "best_ms_store_off": r3(best_off), "best_ms_store_on": r3(best_on),
            "best_ratio": r3(best_on / best_off),
            "median_ms_store_off": r3(med_off), "median_ms_store_on": r3(med_on),
            "median_ratio": r3(med_on / med_off), "median_paired_ratio": r3(median(&mut paired)),
            "median_ms_store_on_run_only": r3(median(&mut run_on)),
            "median_ms_store_on_finish": r3(median(&mut finish))}));
        // Rebuilding a big run.
        let big = fan_out(dir.path(), 5000, Some(store.clone())).await;
        let t0 = Instant::now();
        let stored = store.load(&big.id).expect("load");
        let loaded = t0.elapsed().as_secs_f64() * 1000.0;
        let cfg = dagloop::runs::RunDef::from_goal(goal(dir.path(), 5000)).expect("def").config().expect("config");
        let events = replay(&big.id, cfg, Policy::auto(), SanitizeLimits::default(), &stored.journal);
        let total = t0.elapsed().as_secs_f64() * 1000.0;
        println!("{}", json!({"workload": "resume", "journal_entries": stored.journal.len(), "events": events.len(),
            "load_ms": (loaded * 10.0).round() / 10.0, "load_and_replay_ms": (total * 10.0).round() / 10.0}));
    });
}
