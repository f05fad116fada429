//! The run store's cost on the path users run (`cargo bench --bench store`), JSON lines:
//! - journal entries per second, one commit per entry and batched;
//! - makespan of a 1,000-call zero-latency fan-out with the store on versus off (same run);
//! - time to rebuild a run with 10,000+ journal entries (load from SQLite, replay).

use std::sync::Arc;
use std::time::Instant;

use dagloop::context::SanitizeLimits;
use dagloop::engine::JournalSink;
use dagloop::llm::{Script, ScriptedModel};
use dagloop::machine::{JournalEntry, RunInput, replay};
use dagloop::store::{RunRecord, RunStore, SqliteStore};
use dagloop::{AgentBuilder, Goal, Policy};
use serde_json::{Value, json};

fn goal() -> Goal {
    Goal::from_json(
        &json!({"goal": "fan-out", "output_schema": {"type": "object"},
            "tools": [{"_tool": "t", "_activity": "rust", "type": "object"}]})
        .to_string(),
        "bench.json".as_ref(),
        ".".into(),
    )
    .expect("goal")
}

fn script(n: usize) -> Script {
    let calls: Vec<Value> = (0..n)
        .map(|i| json!({"_tool": "t", "i": i, "_outputPath": format!("†state.r{i}")}))
        .collect();
    let text = json!({"turns": [
        {"solution": {"calls": calls, "output": null}, "chunk_chars": 4096},
        {"solution": {"calls": [], "output": {"done": true}}}
    ]});
    Script::parse(&text.to_string(), "bench").expect("script")
}

async fn fan_out(n: usize, store: Option<Arc<SqliteStore>>) -> (f64, String) {
    let mut b = AgentBuilder::new(goal()).model(Arc::new(ScriptedModel::new(script(n))));
    b.registry_mut().register_fn(
        "t",
        |p: Value| async move { Ok::<_, String>(p["i"].clone()) },
    );
    if let Some(s) = &store {
        b = b.journal(s.clone());
    }
    let agent = b.build().expect("build");
    let id = agent.run_id().to_string();
    if let Some(s) = &store {
        let rec = RunRecord {
            id: id.clone(),
            created_at: 0,
            goal: json!({}),
            base_dir: ".".into(),
            options: json!({}),
        };
        s.create(&rec, std::process::id()).expect("create");
    }
    let t0 = Instant::now();
    let r = agent.run().await;
    assert!(r.succeeded(), "{r:?}");
    (t0.elapsed().as_secs_f64() * 1000.0, id)
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
        // Fan-out with the store off and on (alternating, best of 5 each).
        let n = 1000;
        let (mut off, mut on) = (f64::MAX, f64::MAX);
        let mut last = String::new();
        for _ in 0..5 {
            off = off.min(fan_out(n, None).await.0);
            let (ms, id) = fan_out(n, Some(store.clone())).await;
            on = on.min(ms);
            last = id;
        }
        println!("{}", json!({"workload": "fanout0_store", "n": n, "makespan_ms_store_off": (off * 1000.0).round() / 1000.0,
            "makespan_ms_store_on": (on * 1000.0).round() / 1000.0, "ratio": ((on / off) * 1000.0).round() / 1000.0}));
        // Rebuilding a big run.
        let (_, id) = fan_out(5000, Some(store.clone())).await;
        let _ = last;
        let t0 = Instant::now();
        let stored = store.load(&id).expect("load");
        let loaded = t0.elapsed().as_secs_f64() * 1000.0;
        let cfg = dagloop::engine::config_for(&goal()).expect("config");
        let events = replay(&id, cfg, Policy::auto(), SanitizeLimits::default(), &stored.journal);
        let total = t0.elapsed().as_secs_f64() * 1000.0;
        println!("{}", json!({"workload": "resume", "journal_entries": stored.journal.len(), "events": events.len(),
            "load_ms": (loaded * 10.0).round() / 10.0, "load_and_replay_ms": (total * 10.0).round() / 10.0}));
    });
}
