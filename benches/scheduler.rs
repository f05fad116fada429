//! Scheduler benchmark (DESIGN.md section 5): prints one JSON line per workload.
//!
//! Every workload runs the way `dagloop run` does: an `Agent` on the scripted model (all calls
//! streamed in one turn, then the output), the `work` tool as a registered Rust function with a
//! params schema (validation on), one event subscriber, the in-memory journal, tokio's
//! multi-thread runtime. Beside each figure, the same graph as plain tokio tasks awaiting their
//! parents' join handles (`tokio_ideal_*`): what the machine does with no dagloop at all.
//!
//! Sleep workloads run activities that sleep precisely (on the blocking pool: a thread sleep to
//! just before the deadline, then short sleeps until it) so the figure measures the scheduler
//! and driver, not tokio's 1 ms timer wheel. Each workload runs three times; the median run (by
//! makespan) is printed. `core_only_us_per_call` is the sans-IO scheduler alone, and memory per
//! pending call is measured with a counting global allocator while calls sit in the scheduler.
//!
//! Run with `cargo bench --bench scheduler`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::path::PathBuf;

#[path = "support/alloc.rs"]
mod alloc;

use dagloop::approval::Policy;
use dagloop::llm::{Script, ScriptedModel};
use dagloop::protocol::{Call, CallId, Tool};
use dagloop::scheduler::{CallStatus, Input, Outcome, Scheduler, SchedulerOptions};
use dagloop::state::State;
use dagloop::{AgentBuilder, Goal, RunStatus};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};

fn precise_sleep(deadline: Instant) {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        // Thread sleeps overshoot by the timer slack (~50-100 µs), so aim a little early and
        // finish with short sleeps rather than spinning (the machine is shared).
        let left = deadline - now;
        std::thread::sleep(
            left.saturating_sub(Duration::from_micros(80))
                .max(Duration::from_micros(20)),
        );
    }
}

fn work_tool() -> Tool {
    let mut t = Tool::new("work");
    t.activity = Some("bench".into());
    t
}

fn c(v: Value) -> Call {
    Call::try_from(v).expect("call")
}

/// A DAG: per node its duration and parents (indices of earlier nodes).
struct Dag {
    dur: Vec<u64>,
    parents: Vec<Vec<usize>>,
}

impl Dag {
    fn call(&self, i: usize) -> Value {
        let deps: Vec<String> = self.parents[i]
            .iter()
            .map(|j| format!("†state.n{j}"))
            .collect();
        json!({"_tool": "work", "ms": self.dur[i], "i": i, "deps": deps, "_outputPath": format!("†state.n{i}")})
    }

    fn calls(&self) -> Vec<Value> {
        (0..self.dur.len()).map(|i| self.call(i)).collect()
    }

    /// Longest path, with optional arrival times (ms) per node.
    fn bound(&self, arrival: Option<&[f64]>) -> f64 {
        let nominal: Vec<f64> = self.dur.iter().map(|&d| d as f64).collect();
        self.bound_with(&nominal, arrival)
    }

    /// Longest path with the given durations per node.
    fn bound_with(&self, dur: &[f64], arrival: Option<&[f64]>) -> f64 {
        let mut fin = vec![0f64; self.dur.len()];
        for i in 0..self.dur.len() {
            let ready = self.parents[i].iter().map(|&j| fin[j]).fold(0f64, f64::max);
            let start = arrival.map_or(ready, |a| ready.max(a[i]));
            fin[i] = start + dur.get(i).copied().unwrap_or(0.0);
        }
        fin.iter().copied().fold(0f64, f64::max)
    }
}

/// xorshift64*: a tiny deterministic PRNG.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn fanout_dag(n: usize, ms: u64) -> Dag {
    let mut dur = vec![0];
    let mut parents = vec![vec![]];
    for _ in 0..n {
        dur.push(ms);
        parents.push(vec![0]);
    }
    dur.push(0);
    parents.push((1..=n).collect());
    Dag { dur, parents }
}

fn chain_dag(n: usize, ms: u64) -> Dag {
    Dag {
        dur: vec![ms; n],
        parents: (0..n)
            .map(|i| if i == 0 { vec![] } else { vec![i - 1] })
            .collect(),
    }
}

fn layered(seed: u64) -> Dag {
    let (layers, width) = (10usize, 20usize);
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut dur = Vec::new();
    let mut parents = Vec::new();
    for l in 0..layers {
        for _ in 0..width {
            dur.push(5 + rng.below(46));
            let mut ps = Vec::new();
            if l > 0 {
                let k = 1 + rng.below(3) as usize;
                while ps.len() < k {
                    let p = (l - 1) * width + rng.below(width as u64) as usize;
                    if !ps.contains(&p) {
                        ps.push(p);
                    }
                }
                ps.sort_unstable();
            }
            parents.push(ps);
        }
    }
    Dag { dur, parents }
}

/// 1 → n → 1: the n middle calls read the root's output, the last reads all of theirs.
fn fanout_calls(n: usize, ms: u64) -> Vec<Value> {
    let mut v = Vec::with_capacity(n + 2);
    v.push(json!({"_tool": "work", "ms": 0, "i": 0, "_outputPath": "†state.root"}));
    for i in 0..n {
        v.push(json!({"_tool": "work", "ms": ms, "i": i + 1, "in": "†state.root", "_outputPath": format!("†state.mid.k{i}")}));
    }
    v.push(json!({"_tool": "work", "ms": 0, "i": n + 1, "all": "†state.mid"}));
    v
}

/// n calls, each reading the previous one's output.
fn chain_calls(n: usize, ms: u64) -> Vec<Value> {
    (0..n)
        .map(|i| {
            let mut v =
                json!({"_tool": "work", "ms": ms, "i": i, "_outputPath": format!("†state.c{i}")});
            if i > 0 {
                v["in"] = json!(format!("†state.c{}", i - 1));
            }
            v
        })
        .collect()
}

fn as_calls(v: Vec<Value>) -> Vec<Call> {
    v.into_iter().map(c).collect()
}

/// The goal every run uses: one Rust tool (`work`: sleep `ms`, return 1) with a params schema,
/// so parameter validation runs as it does for users; auto approval.
fn goal() -> Goal {
    let text = json!({
        "goal": "bench",
        "output_schema": {"type": "object"},
        "tools": [{"_tool": "work", "_activity": "rust", "type": "object",
            "properties": {"ms": {"type": "integer", "minimum": 0}, "i": {"type": "integer"}},
            "required": ["ms", "i"]}],
        "limits": {"max_steps": 5}
    })
    .to_string();
    Goal::from_json(&text, "bench.json".as_ref(), PathBuf::new()).expect("goal")
}

#[derive(serde::Deserialize)]
struct Work {
    ms: u64,
    i: usize,
}

/// The model's first turn as text: every call, then the output turn. A streamed workload
/// (`gap_ms` > 0) pads each call to the same width so that with `chunk_chars` = that width each
/// chunk closes exactly one call (its arrivals); otherwise the calls are written as a model
/// writes them, unpadded (padded to the widest, a fan-in naming a hundred parents made every
/// call 1.5 KB of mostly spaces to parse).
fn script(calls: &[Value], gap_ms: u64) -> Script {
    let texts: Vec<String> = calls.iter().map(Value::to_string).collect();
    let width = if gap_ms > 0 {
        texts.iter().map(String::len).max().unwrap_or(0) + 2
    } else {
        0
    };
    let mut body = format!("{:<width$}", "{\"calls\": [");
    for (k, t) in texts.iter().enumerate() {
        let sep = if k + 1 < texts.len() { "," } else { "" };
        body.push_str(&format!("{:<width$}", format!("{t}{sep}")));
    }
    body.push_str("], \"output\": null}");
    let chunk = if gap_ms > 0 { width } else { 1 << 20 };
    let turns = json!({"turns": [
        {"text": body, "chunk_chars": chunk, "chunk_delay_ms": gap_ms},
        {"solution": {"calls": [], "output": {}}}
    ]});
    Script::parse(&turns.to_string(), "bench").expect("script")
}

/// Runs calls the way `dagloop run` does: `Agent` on the scripted model (the calls stream in
/// one turn; with `gap_ms` one call per chunk, `gap_ms` apart), the `work` activity registered
/// as a Rust function, parameter validation on, one event subscriber, the in-memory journal,
/// on the caller's multi-thread runtime. Returns the makespan (start to the run's result),
/// each call's arrival (ms since start, from its `call_received` event; streamed runs only)
/// and how long each activity really slept.
async fn run(calls: Vec<Value>, gap_ms: u64) -> Run {
    run_traced(calls, gap_ms, true).await
}

/// [`run`], in or out of the process's traces (`AgentBuilder::traced`).
async fn run_traced(calls: Vec<Value>, gap_ms: u64, traced: bool) -> Run {
    let n = calls.len();
    let actual: Arc<Mutex<Vec<(usize, f64, f64)>>> = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let start: Arc<std::sync::OnceLock<Instant>> = Arc::default();
    let mut builder = AgentBuilder::new(dagloop::RunDef::from_goal(goal()).expect("defined"))
        .model(Arc::new(ScriptedModel::new(script(&calls, gap_ms))))
        .traced(traced);
    let (act, started) = (actual.clone(), start.clone());
    builder.registry_mut().register_fn("work", move |w: Work| {
        let (act, started) = (act.clone(), started.clone());
        async move {
            if w.ms > 0 {
                let t = Instant::now();
                let deadline = t + Duration::from_millis(w.ms);
                let _ = tokio::task::spawn_blocking(move || precise_sleep(deadline)).await;
                let at = started
                    .get()
                    .map_or(0.0, |t0| (t - *t0).as_secs_f64() * 1000.0);
                if let Ok(mut a) = act.lock() {
                    a.push((w.i, at, t.elapsed().as_secs_f64() * 1000.0));
                }
            }
            Ok::<_, String>(1)
        }
    });
    let agent = builder.build().expect("agent");
    let cpu0 = cpu_ms();
    let t0 = Instant::now();
    let _ = start.set(t0);
    let handle = agent.start();
    let mut events = handle.subscribe_from(0);
    let watcher = tokio::spawn(async move {
        let mut arrivals = Vec::new();
        while let Some(ev) = events.recv().await {
            if gap_ms > 0 && ev.kind.name() == "call_received" {
                arrivals.push(t0.elapsed().as_secs_f64() * 1000.0);
            }
        }
        (arrivals, events.lagged())
    });
    let result = handle.wait().await;
    let makespan = t0.elapsed().as_secs_f64() * 1000.0;
    let cpu_ms = cpu_ms() - cpu0;
    assert_eq!(result.status, RunStatus::Succeeded, "{:?}", result.error);
    assert_eq!(result.count(CallStatus::Done), n, "every call ran");
    let (arrivals, replayed) = watcher.await.unwrap_or_default();
    let journal_replays = handle.event_replays();
    drop(handle);
    let mut durations = vec![0f64; n];
    let mut starts = vec![0f64; n];
    if let Ok(a) = actual.lock() {
        for &(i, at, ms) in a.iter() {
            if let (Some(d), Some(s)) = (durations.get_mut(i), starts.get_mut(i)) {
                (*d, *s) = (ms, at);
            }
        }
    }
    Run {
        makespan,
        arrivals,
        durations,
        starts,
        replayed,
        journal_replays,
        cpu_ms,
    }
}

/// The same graph as plain tokio tasks, no dagloop: each task awaits its parents' (shared)
/// join handles, then does the work. Milliseconds from the first spawn to the last task's end.
async fn tokio_ideal(dag: &Dag) -> f64 {
    tokio_ideal_timed(dag).await.0
}

/// [`tokio_ideal`], with when each sleeping task's sleep started and how long it slept (ms
/// since start, by node; 0 for zero-latency nodes).
async fn tokio_ideal_timed(dag: &Dag) -> (f64, Vec<f64>, Vec<f64>) {
    type Handle = futures::future::Shared<BoxFuture<'static, Value>>;
    let n = dag.dur.len();
    let times: Arc<Mutex<Vec<(usize, f64, f64)>>> = Arc::default();
    let t0 = Instant::now();
    let mut handles: Vec<Handle> = Vec::with_capacity(n);
    for i in 0..n {
        let deps: Vec<Handle> = dag.parents[i].iter().map(|&j| handles[j].clone()).collect();
        let ms = dag.dur[i];
        let times = times.clone();
        let task = tokio::spawn(async move {
            for d in deps {
                d.await;
            }
            if ms > 0 {
                let t = Instant::now();
                let deadline = t + Duration::from_millis(ms);
                let _ = tokio::task::spawn_blocking(move || precise_sleep(deadline)).await;
                let at = (t - t0).as_secs_f64() * 1000.0;
                if let Ok(mut v) = times.lock() {
                    v.push((i, at, t.elapsed().as_secs_f64() * 1000.0));
                }
            }
            json!(1)
        });
        handles.push(task.map(|r| r.unwrap_or(Value::Null)).boxed().shared());
    }
    futures::future::join_all(handles).await;
    let total = t0.elapsed().as_secs_f64() * 1000.0;
    let (mut starts, mut durations) = (vec![0f64; n], vec![0f64; n]);
    if let Ok(v) = times.lock() {
        for &(i, at, ms) in v.iter() {
            (starts[i], durations[i]) = (at, ms);
        }
    }
    (total, starts, durations)
}

/// One measured run.
struct Run {
    makespan: f64,
    /// Arrival of each call (ms since start), for streamed runs.
    arrivals: Vec<f64>,
    /// How long each activity really slept (ms), by call id (= node index).
    durations: Vec<f64>,
    /// When each activity started (ms since start), by call id; 0 for zero-latency calls.
    starts: Vec<f64>,
    /// Events the subscriber fell behind the ring by, and was served from the kept history.
    replayed: u64,
    /// Times the run's journal was replayed to make events for the subscriber.
    journal_replays: u32,
    /// CPU time the process spent while it ran (every thread's but the OTLP sink's), ms.
    cpu_ms: f64,
}

/// The thread the OTLP rows' sink runs on: a collector's work, not the run's.
const SINK_THREAD: &str = "bench-sink";

/// CPU time this process's threads have spent so far, in ms, from each thread's
/// `/proc/self/task/*/schedstat` (nanoseconds on a CPU), leaving out the sink's thread. Threads
/// that ended are not counted: the runtime's keep their threads for the whole benchmark.
fn cpu_ms() -> f64 {
    threads_cpu_ms(|name| name != SINK_THREAD)
}

/// [`cpu_ms`] of the threads whose name `counted` accepts.
fn threads_cpu_ms(counted: impl Fn(&str) -> bool) -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return f64::NAN;
    };
    let mut ns = 0u64;
    for t in tasks.flatten() {
        let dir = t.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !counted(comm.trim_end()) {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("schedstat")).unwrap_or_default();
        ns += stat
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    ns as f64 / 1e6
}

/// CPU time of the OTel rows' sink (a collector's work), in ms.
fn sink_cpu_ms() -> f64 {
    threads_cpu_ms(|name| name == SINK_THREAD)
}

/// The threads tracing runs on: the span worker and the OTLP sender.
fn tracing_cpu_ms() -> f64 {
    threads_cpu_ms(|name| name == "dagloop-spans" || name == "dagloop-otlp")
}

/// Bytes the scheduler keeps per waiting call: the root never finishes, so the others wait.
fn bytes_per_pending(calls: impl Iterator<Item = Call>, n: usize) -> f64 {
    let mut s = Scheduler::new(
        State::new(),
        vec![work_tool()],
        Policy::auto(),
        SchedulerOptions::default(),
    );
    let mut out = Vec::new();
    let before = alloc::live();
    for (i, call) in calls.enumerate() {
        let id = dagloop::protocol::CallId(i as u64);
        s.handle_into(
            Input::CallArrived {
                id,
                call: Ok(call.into()),
                parsed: Default::default(),
            },
            0,
            &mut out,
        );
        out.clear();
    }
    out.shrink_to_fit();
    let after = alloc::live();
    let (waiting, _, _) = s.counts();
    assert!(waiting + 1 >= n, "calls are pending: {waiting}");
    drop(s);
    (after - before) as f64 / n as f64
}

fn line(
    workload: &str,
    n: usize,
    makespan: f64,
    cp: Option<f64>,
    overhead: Option<f64>,
    bytes: Option<f64>,
    extra: Value,
) {
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    let mut v = json!({
        "workload": workload,
        "n": n,
        "makespan_ms": round(makespan),
        "critical_path_ms": cp.map(round),
        "ratio": cp.map(|cp| round(makespan / cp)),
        "overhead_us_per_call": overhead.map(round),
        "bytes_per_pending_call": bytes.map(|b| b.round()),
    });
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    println!("{v}");
}

/// The sans-IO state machine alone on a zero-latency workload: every launched call finishes
/// at once (no tokio, no tasks); returns microseconds per call.
fn core_only(calls: Vec<Call>) -> f64 {
    let n = calls.len();
    let mut s = Scheduler::new(
        State::new(),
        vec![work_tool()],
        Policy::auto(),
        SchedulerOptions::default(),
    );
    let mut out = Vec::new();
    let mut ready = std::collections::VecDeque::new();
    let t0 = Instant::now();
    for (i, call) in calls.into_iter().enumerate() {
        let id = dagloop::protocol::CallId(i as u64);
        s.handle_into(
            Input::CallArrived {
                id,
                call: Ok(call.into()),
                parsed: Default::default(),
            },
            0,
            &mut out,
        );
        collect(&mut out, &mut ready);
    }
    s.handle_into(Input::StreamClosed, 0, &mut out);
    collect(&mut out, &mut ready);
    while let Some(id) = ready.pop_front() {
        s.handle_into(
            Input::Finished {
                id,
                outcome: Outcome::ok(json!(1)),
            },
            0,
            &mut out,
        );
        collect(&mut out, &mut ready);
    }
    let (_, report) = s.finish();
    let us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
    assert_eq!(report.count(CallStatus::Done), n);
    us
}

fn collect(
    out: &mut Vec<dagloop::scheduler::Action>,
    ready: &mut std::collections::VecDeque<CallId>,
) {
    for a in out.drain(..) {
        if let dagloop::scheduler::Action::Launch { id, .. } = a {
            ready.push_back(id);
        }
    }
}

/// Runs `f` three times and returns the median run by makespan.
async fn median<F, Fut>(mut f: F) -> Run
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Run>,
{
    let mut runs = Vec::new();
    for _ in 0..3 {
        runs.push(f().await);
    }
    // The median CPU time of the three, beside the run of median makespan.
    let mut cpu: Vec<f64> = runs.iter().map(|r| r.cpu_ms).collect();
    cpu.sort_by(f64::total_cmp);
    runs.sort_by(|a, b| a.makespan.total_cmp(&b.makespan));
    let mut r = runs.swap_remove(1);
    r.cpu_ms = cpu[1];
    r
}

/// Prints a sleep workload: the ratio to the nominal critical path, and (extra fields) to the
/// critical path computed from the activities' measured sleeps, which isolates scheduling
/// overhead from the sleeping activity's own timer slack.
fn sleep_line(workload: &str, dag: &Dag, r: &Run, arrivals: Option<&[f64]>, extra: Value) {
    let cp = dag.bound(arrivals);
    let cp_actual = dag.bound_with(&r.durations, arrivals);
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    let mut extra = extra;
    extra["critical_path_measured_ms"] = json!(round(cp_actual));
    extra["ratio_vs_measured"] = json!(round(r.makespan / cp_actual));
    line(
        workload,
        dag.dur.len(),
        r.makespan,
        Some(cp),
        None,
        None,
        extra,
    );
}

/// `DAGLOOP_BENCH_N` overrides the zero-latency sizes (for profiling runs).
fn env_n(default: usize) -> usize {
    std::env::var("DAGLOOP_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Microseconds per call of the tokio-ideal run of `dag` (median of three).
async fn ideal_us_per_call(dag: &Dag) -> f64 {
    let mut v = Vec::new();
    for _ in 0..3 {
        v.push(tokio_ideal(dag).await);
    }
    v.sort_by(f64::total_cmp);
    v[1] * 1000.0 / dag.dur.len() as f64
}

/// Microseconds per call of `benches/asyncio_ideal.py` (a plain asyncio scheduler, stdlib only)
/// on the same workload, run as a `python3` subprocess between dagloop's runs; None when no
/// `python3` runs here (the line then says null).
fn asyncio_ideal_us_per_call(workload: &str, n: usize) -> Option<f64> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/asyncio_ideal.py");
    // The script's N is the workload's size parameter: the fan-out's middle, the chain's length.
    let size = if workload == "fanout0" { n - 2 } else { n };
    let out = std::process::Command::new("python3")
        .args([script, workload, &size.to_string()])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line: Value = serde_json::from_str(text.lines().next()?).ok()?;
    line["asyncio_ideal_us_per_call"].as_f64()
}

/// The zero-latency lines: dagloop's µs per call beside the tokio-ideal figure of the same run.
async fn zero_line(workload: &str, calls: Vec<Value>, dag: &Dag) {
    let n = calls.len();
    // Counted only here: timed with the counting allocator on, a run also times the counters'
    // atomics, shared by every thread on every allocation (about a fifth of the run).
    alloc::counting(true);
    let bytes = bytes_per_pending(as_calls(calls.clone()).into_iter(), n);
    alloc::counting(false);
    let r = median(|| run(calls.clone(), 0)).await;
    let m = r.makespan;
    // One more run, untimed, counting every allocation made while it runs (every thread's).
    alloc::counting(true);
    let before = alloc::allocations();
    run(calls.clone(), 0).await;
    let allocations = alloc::allocations() - before;
    alloc::counting(false);
    let ideal = ideal_us_per_call(dag).await;
    let asyncio = asyncio_ideal_us_per_call(workload, n);
    let core = core_only(as_calls(calls));
    let us = m * 1000.0 / n as f64;
    let cpu = r.cpu_ms * 1000.0 / n as f64;
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    line(
        workload,
        n,
        m,
        None,
        Some(us),
        Some(bytes),
        json!({
            "cpu_us_per_call": round(cpu),
            "tokio_ideal_us_per_call": round(ideal),
            "ratio_to_ideal": round(us / ideal),
            "asyncio_ideal_us_per_call": asyncio.map(round),
            "ratio_to_asyncio_ideal": asyncio.map(|a| round(us / a)),
            "core_only_us_per_call": round(core),
            "allocations_per_call": round(allocations as f64 / n as f64),
            "subscriber_caught_up_events": r.replayed,
            "journal_replays": r.journal_replays,
        }),
    );
}

/// Sleep workloads: dagloop's ratio beside the tokio-ideal ratio of the same graph.
async fn sleep_workload(workload: &str, dag: &Dag) {
    let r = median(|| run(dag.calls(), 0)).await;
    let mut ideal = Vec::new();
    for _ in 0..3 {
        ideal.push(tokio_ideal(dag).await);
    }
    ideal.sort_by(f64::total_cmp);
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    sleep_line(
        workload,
        dag,
        &r,
        None,
        json!({"tokio_ideal_ratio": round(ideal[1] / dag.bound(None))}),
    );
}

fn main() {
    // The allocator's options the `dagloop` binary runs with (src/cli/alloc.rs).
    dagloop::cli::tune_allocator();
    // Allocations are counted only while memory is measured (`zero_line`).
    alloc::counting(false);
    // As the CLI runs: tokio's multi-thread runtime, one worker per core.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(512)
        .thread_keep_alive(Duration::from_secs(600))
        .build()
        .expect("runtime");
    let only: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    // `chain0` selects every workload whose name holds it; `chain0$` that one alone.
    let want = |w: &str| {
        only.as_deref().is_none_or(|o| match o.strip_suffix('$') {
            Some(exact) => w == exact,
            None => w.contains(o) || o == "bench",
        })
    };
    rt.block_on(async {
        // Warm the blocking pool so thread creation is not measured.
        run(fanout_calls(120, 5), 0).await;
        tokio_ideal(&fanout_dag(120, 5)).await;

        if want("fanout") {
            sleep_workload("fanout", &fanout_dag(100, 50)).await;
        }
        if want("chain") {
            sleep_workload("chain", &chain_dag(50, 10)).await;
        }
        if want("layered") {
            sleep_workload("layered", &layered(7)).await;
        }
        if want("fanout0") {
            let n = env_n(100_000);
            zero_line("fanout0", fanout_calls(n, 0), &fanout_dag(n, 0)).await;
        }
        if want("chain0") {
            let n = env_n(10_000);
            zero_line("chain0", chain_calls(n, 0), &chain_dag(n, 0)).await;
        }
        // Only when asked for (`cargo bench --bench scheduler -- core`): the sans-IO scheduler
        // alone, for profiling it under callgrind without the rest of the run.
        if only.as_deref() == Some("core") {
            let n = env_n(100_000);
            let f = core_only(as_calls(fanout_calls(n, 0)));
            let c = core_only(as_calls(chain_calls(env_n(10_000), 0)));
            println!(
                "{}",
                json!({"workload": "core", "fanout0_us_per_call": f, "chain0_us_per_hop": c})
            );
        }
        // Only when asked for (`-- timeline`): where a sleep fan-out's time over its critical
        // path goes, from the activities' own clocks.
        if only.as_deref() == Some("timeline") {
            timeline(100).await;
        }
        otel_rows(&want).await;
        if want("streamed") {
            let dag = layered(7);
            let r = median(|| run(dag.calls(), 5)).await;
            let stream_ms = r.arrivals.last().copied().unwrap_or(0.0);
            let whole = stream_ms + dag.bound(None);
            let arrivals = r.arrivals.clone();
            sleep_line(
                "streamed",
                &dag,
                &r,
                Some(&arrivals),
                json!({"stream_ms": (stream_ms * 1000.0).round() / 1000.0,
                       "wait_for_whole_plan_ms": (whole * 1000.0).round() / 1000.0}),
            );
        }
    });
}

/// A 1 → n → 1 fan-out whose every call sleeps (the root and the last 1 ms, the middle 50 ms),
/// run five times beside the same graph as plain tokio tasks: the medians, in ms, of the start
/// (run start to the root's activity), the fan-out's launch (the root's end to the first and
/// the last middle activity), the fan-in (the last middle activity's end to the last call's),
/// the end (its end to the run's result) and the whole run's time over the critical path of
/// the sleeps as measured.
async fn timeline(n: usize) {
    let mut dag = fanout_dag(n, 50);
    dag.dur[0] = 1;
    dag.dur[n + 1] = 1;
    let phases = |makespan: f64, starts: &[f64], durations: &[f64]| {
        let end = |i: usize| starts[i] + durations[i];
        let mids = 1..=n;
        let first = mids.clone().map(|i| starts[i]).fold(f64::MAX, f64::min);
        let last = mids.clone().map(|i| starts[i]).fold(0.0, f64::max);
        let last_end = mids.map(end).fold(0.0, f64::max);
        [
            starts[0],
            first - end(0),
            last - end(0),
            starts[n + 1] - last_end,
            makespan - end(n + 1),
            makespan - dag.bound_with(durations, None),
        ]
    };
    let (mut ours, mut ideal) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let r = run(dag.calls(), 0).await;
        ours.push(phases(r.makespan, &r.starts, &r.durations));
        let (total, starts, durations) = tokio_ideal_timed(&dag).await;
        ideal.push(phases(total, &starts, &durations));
    }
    let medians = |rows: &[[f64; 6]]| {
        let names = [
            "start",
            "first_launch",
            "last_launch",
            "fan_in",
            "end",
            "over_measured_path",
        ];
        let mut o = serde_json::Map::new();
        for (k, name) in names.iter().enumerate() {
            let mut v: Vec<f64> = rows.iter().map(|r| r[k]).collect();
            v.sort_by(f64::total_cmp);
            o.insert(
                format!("{name}_ms"),
                json!((v[v.len() / 2] * 1000.0).round() / 1000.0),
            );
        }
        Value::Object(o)
    };
    println!(
        "{}",
        json!({"workload": "timeline", "n": n + 2, "dagloop": medians(&ours),
               "tokio_ideal": medians(&ideal)})
    );
}

/// fanout0 and chain0 again with every run's spans exported over OTLP/HTTP (sampling 100%) to a
/// local sink that accepts and drops them: the cost of tracing per call (`docs/observability.md`).
/// Last, because the span pipeline is the process's for good once installed.
#[cfg(all(feature = "otel", feature = "server"))]
async fn otel_rows(want: &dyn Fn(&str) -> bool) {
    if !want("fanout0_otel") && !want("chain0_otel") {
        return;
    }
    // The sink runs on a thread and runtime of its own, as a collector would in a process of
    // its own: its work shares the machine's cores with the run, not the run's runtime. It
    // keeps what it is sent and counts the spans after the runs (decoding is not the run's
    // work): the pipeline's own settings (a queue of 16,384 spans, batches of 512) are the
    // ones measured, and whether they dropped any is printed, not assumed.
    let got: std::sync::Arc<std::sync::Mutex<Vec<axum::body::Bytes>>> = Default::default();
    let kept = got.clone();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("sink");
    listener.set_nonblocking(true).expect("sink");
    let addr = listener.local_addr().expect("addr");
    let sink_thread = std::thread::Builder::new().name(SINK_THREAD.into());
    let _sink = sink_thread.spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("sink runtime");
        rt.block_on(async move {
            let sink = axum::Router::new().route(
                "/v1/traces",
                axum::routing::post(move |body: axum::body::Bytes| {
                    let kept = kept.clone();
                    async move {
                        kept.lock().expect("sink").push(body);
                        ""
                    }
                }),
            );
            let listener = tokio::net::TcpListener::from_std(listener).expect("sink");
            axum::serve(listener, sink).await
        })
    });
    // SAFETY of the environment: set before any thread reads it (the exporter is built below).
    unsafe {
        std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}"));
        std::env::set_var("OTEL_TRACES_SAMPLER", "always_on");
    }
    assert!(dagloop::telemetry::init_from_env().expect("otel"));
    if want("fanout0_otel") {
        let n = env_n(100_000);
        otel_line("fanout0_otel", fanout_calls(n, 0), env_pairs(9)).await;
    }
    if want("chain0_otel") {
        let n = env_n(10_000);
        otel_line("chain0_otel", chain_calls(n, 0), env_pairs(21)).await;
    }
    dagloop::telemetry::flush();
    let received: usize = {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use prost::Message;
        got.lock()
            .expect("sink")
            .iter()
            .filter_map(|b| ExportTraceServiceRequest::decode(b.as_ref()).ok())
            .flat_map(|r| r.resource_spans)
            .flat_map(|r| r.scope_spans)
            .map(|s| s.spans.len())
            .sum()
    };
    println!(
        "{}",
        json!({"workload": "otel_export", "spans_exported": dagloop::telemetry::spans::exported(),
               "spans_dropped": dagloop::telemetry::send::dropped(), "spans_received": received})
    );
}

/// A zero-latency workload with and without its spans exported, in the same process, in
/// alternating pairs of runs (the first of each pair alternating too): the machine's speed
/// changes from second to second, and runs seconds apart share it. Prints the traced runs'
/// time and CPU time per call, the untraced runs' beside them, and the median of the pairs'
/// ratios (`time_added_pct`, `cpu_added_pct`): what export adds per call.
#[cfg(all(feature = "otel", feature = "server"))]
async fn otel_line(workload: &str, calls: Vec<Value>, pairs: usize) {
    let n = calls.len() as f64;
    let (mut on, mut off) = (Vec::new(), Vec::new());
    // CPU time of tracing's own threads while traced runs ran (each run waits for its spans),
    // and of the sink's: a collector's work, not the run's, but it shares the machine's cores.
    let (mut tracing_ms, mut sink_ms) = (0.0, 0.0);
    for i in 0..pairs {
        for traced in [i % 2 == 0, i % 2 == 1] {
            let before = tracing_cpu_ms();
            let sink_before = sink_cpu_ms();
            let r = run_traced(calls.clone(), 0, traced).await;
            if traced {
                tracing_ms += tracing_cpu_ms() - before;
                sink_ms += sink_cpu_ms() - sink_before;
                on.push(r)
            } else {
                off.push(r)
            }
        }
    }
    let traced_ms: f64 = on.iter().map(|r| r.cpu_ms).sum();
    alloc::counting(true);
    let before = alloc::allocations();
    run(calls.clone(), 0).await;
    let allocations = alloc::allocations() - before;
    alloc::counting(false);
    let med = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let per_call =
        |runs: &[Run], f: fn(&Run) -> f64| med(runs.iter().map(|r| f(r) * 1000.0 / n).collect());
    let added = |f: fn(&Run) -> f64| {
        let ratios = on.iter().zip(&off).map(|(a, b)| f(a) / f(b)).collect();
        ((med(ratios) - 1.0) * 1000.0).round() / 10.0
    };
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    // Each pair's time added, in the order run: how far one pair's ratio strays from the median.
    let each: Vec<f64> = on
        .iter()
        .zip(&off)
        .map(|(a, b)| ((a.makespan / b.makespan - 1.0) * 1000.0).round() / 10.0)
        .collect();
    let mut ratios: Vec<f64> = on
        .iter()
        .zip(&off)
        .map(|(a, b)| a.makespan / b.makespan)
        .collect();
    ratios.sort_by(f64::total_cmp);
    let (lo, hi) = median_ci95(&ratios);
    let added_ci95 = [lo, hi].map(|r| ((r - 1.0) * 1000.0).round() / 10.0);
    println!(
        "{}",
        json!({
            "workload": workload,
            "n": calls.len(),
            "pairs": pairs,
            "time_added_pct_each_pair": each,
            "overhead_us_per_call": round(per_call(&on, |r| r.makespan)),
            "untraced_us_per_call": round(per_call(&off, |r| r.makespan)),
            "time_added_pct": added(|r| r.makespan),
            "time_added_pct_ci95": added_ci95,
            "cpu_us_per_call": round(per_call(&on, |r| r.cpu_ms)),
            "untraced_cpu_us_per_call": round(per_call(&off, |r| r.cpu_ms)),
            "cpu_added_pct": added(|r| r.cpu_ms),
            "tracing_threads_cpu_us_per_call": round(tracing_ms * 1000.0 / (n * pairs as f64)),
            "tracing_threads_share_pct": (tracing_ms / traced_ms * 1000.0).round() / 10.0,
            "sink_cpu_us_per_call": round(sink_ms * 1000.0 / (n * pairs as f64)),
            "allocations_per_call": round(allocations as f64 / n),
        })
    );
}

/// Where the median of the population `sorted` was drawn from lies, with 95% confidence: the
/// order statistics around the sample's median between which a Binomial(n, 1/2) count puts it
/// (its normal approximation; no resampling, so the same pairs give the same interval). With
/// 9 pairs it is the whole range; it narrows as the square root of the pairs
/// (`DAGLOOP_BENCH_PAIRS`).
#[cfg(all(feature = "otel", feature = "server"))]
fn median_ci95(sorted: &[f64]) -> (f64, f64) {
    let n = sorted.len() as f64;
    let half = 0.98 * n.sqrt();
    // 1-based ranks of the bounds, then 0-based indexes within the sample.
    let lo = (n / 2.0 - half).floor().max(1.0) as usize - 1;
    let hi = ((1.0 + n / 2.0 + half).ceil() as usize)
        .min(sorted.len())
        .max(1)
        - 1;
    match (sorted.get(lo), sorted.get(hi)) {
        (Some(&l), Some(&h)) => (l, h),
        _ => (f64::NAN, f64::NAN),
    }
}

/// How many traced and untraced pairs a workload runs: `DAGLOOP_BENCH_PAIRS`, else `default`.
#[cfg(all(feature = "otel", feature = "server"))]
fn env_pairs(default: usize) -> usize {
    std::env::var("DAGLOOP_BENCH_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&p| p > 0)
        .unwrap_or(default)
}

#[cfg(not(all(feature = "otel", feature = "server")))]
async fn otel_rows(_want: &dyn Fn(&str) -> bool) {}
