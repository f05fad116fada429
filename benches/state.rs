//! State benchmark: reads stay fast when the log is long (the path index, not a rescan).
//!
//! Run with `cargo bench --bench state`. Prints one JSON line per workload.

use std::hint::black_box;
use std::time::Instant;

use dagloop::protocol::{OutputMethod, Path, Segment};
use dagloop::state::{State, apply};
use serde_json::json;

const N: usize = 100_000;

fn key(i: usize) -> Path {
    Path::new(
        "state",
        [
            Segment::Key("users".into()),
            Segment::Key(format!("u{i}")),
            Segment::Key("score".into()),
        ],
    )
}

fn per_op_ns(start: Instant, ops: usize) -> f64 {
    start.elapsed().as_nanos() as f64 / ops as f64
}

fn main() {
    // 1. 100,000 writes to distinct paths, then point reads.
    let mut s = State::new();
    let t = Instant::now();
    for i in 0..N {
        s.write(key(i), json!(i), OutputMethod::Set, None, i as u64);
    }
    let write_ns = per_op_ns(t, N);
    let reads = 100_000;
    let paths: Vec<Path> = (0..reads).map(|i| key((i * 7919) % N)).collect();
    let t = Instant::now();
    for p in &paths {
        black_box(s.get(p));
    }
    let read_ns = per_op_ns(t, reads);
    println!(
        "{}",
        json!({"workload": "distinct_paths", "writes": N, "write_ns": write_ns.round(), "point_read_ns": read_ns.round()})
    );

    // 2. 100,000 `set` writes to one path: the newest set stops the search.
    let mut s = State::new();
    let p = key(1);
    for i in 0..N {
        s.write(p.clone(), json!(i), OutputMethod::Set, None, i as u64);
    }
    let t = Instant::now();
    for _ in 0..reads {
        black_box(s.get(&p));
    }
    let same_ns = per_op_ns(t, reads);
    println!(
        "{}",
        json!({"workload": "same_path_set", "writes": N, "point_read_ns": same_ns.round()})
    );

    // 3. The same log read by replaying everything (what the index avoids), for comparison.
    let log = s.log().to_vec();
    let t = Instant::now();
    let replays = 20;
    for _ in 0..replays {
        let mut doc = None;
        for w in &log {
            apply::apply_at(&mut doc, w.path.rest(), w.method, &w.value);
        }
        black_box(doc.and_then(|d| apply::get(&d, p.rest()).cloned()));
    }
    let replay_ns = per_op_ns(t, replays);
    println!(
        "{}",
        json!({"workload": "naive_replay", "writes": N, "point_read_ns": replay_ns.round()})
    );

    // 4. A merged view of a whole kind after 100,000 writes (what the model is shown).
    let mut s = State::new();
    for i in 0..N {
        s.write(
            key(i % 1000),
            json!({"v": i}),
            OutputMethod::Merge,
            None,
            i as u64,
        );
    }
    let t = Instant::now();
    black_box(s.view("state"));
    let view_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    for i in 0..1000 {
        black_box(s.get(&key(i)));
    }
    let merged_ns = per_op_ns(t, 1000);
    println!(
        "{}",
        json!({"workload": "merge_1000_paths", "writes": N, "view_ms": (view_ms * 100.0).round() / 100.0, "point_read_ns": merged_ns.round()})
    );

    // 5. The state shown to the model at every step of a 200-step run, each step making 50
    //    writes to the same 10 paths (so the state stays small while the log grows): `view`
    //    (kept up to date) beside replaying the kind's log (`get` of its root, what `view` did
    //    before), at the first and the last 20 steps.
    let mut s = State::new();
    let (mut view_us, mut replay_us) = (Vec::new(), Vec::new());
    for step in 0..200usize {
        for j in 0..50usize {
            s.write(
                key(j % 10),
                json!({"step": step, "j": j}),
                OutputMethod::Set,
                None,
                (step * 50 + j) as u64,
            );
        }
        let t = Instant::now();
        let v = black_box(s.view("state"));
        view_us.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        let r = black_box(s.get(&Path::root("state")));
        replay_us.push(t.elapsed().as_secs_f64() * 1e6);
        assert_eq!(v, r);
    }
    let mean = |v: &[f64]| (v.iter().sum::<f64>() / v.len() as f64 * 10.0).round() / 10.0;
    println!(
        "{}",
        json!({"workload": "view_per_step", "steps": 200, "writes_per_step": 50,
            "view_us_first_20": mean(&view_us[..20]), "view_us_last_20": mean(&view_us[180..]),
            "replay_us_first_20": mean(&replay_us[..20]), "replay_us_last_20": mean(&replay_us[180..])})
    );
}
