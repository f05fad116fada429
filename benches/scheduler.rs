//! Scheduler benchmark (DESIGN.md section 5): prints one JSON line per workload.
//!
//! Sleep workloads run activities that sleep precisely (on the blocking pool: a thread sleep to
//! just before the deadline, then yielding until it) so the figure measures the scheduler and
//! driver, not tokio's 1 ms timer wheel. Each sleep workload runs three times; the median run
//! (by makespan) is printed. Memory per pending call is measured with a counting global
//! allocator while calls sit in the scheduler (sans-IO, nothing running).
//!
//! Run with `cargo bench --bench scheduler`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dagloop::approval::{Policy, ScriptedApprover};
use dagloop::engine::bus::EventBus;
use dagloop::engine::inner::{DriveOptions, Executor, drive};
use dagloop::protocol::{Call, CallId, Tool};
use dagloop::scheduler::{CallStatus, Input, Outcome, Scheduler, SchedulerOptions};
use dagloop::state::State;
use futures::FutureExt;
use futures::StreamExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards every request to the system allocator unchanged; only counts bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

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

/// Sleeps `ms` (a param), then returns 1; records how long each activity really took (ms).
struct SleepExec {
    actual: Arc<Mutex<Vec<(u64, f64)>>>,
}

impl Executor for SleepExec {
    fn execute(&self, id: CallId, _tool: &Tool, call: Call) -> BoxFuture<'static, Outcome> {
        let ms = call.params.get("ms").and_then(Value::as_u64).unwrap_or(0);
        if ms == 0 {
            return futures::future::ready(Outcome::ok(json!(1))).boxed();
        }
        let start = Instant::now();
        let deadline = start + Duration::from_millis(ms);
        let actual = self.actual.clone();
        async move {
            let _ = tokio::task::spawn_blocking(move || precise_sleep(deadline)).await;
            if let Ok(mut a) = actual.lock() {
                a.push((id.0, start.elapsed().as_secs_f64() * 1000.0));
            }
            Outcome::ok(json!(1))
        }
        .boxed()
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
    fn call(&self, i: usize) -> Call {
        let deps: Vec<String> = self.parents[i]
            .iter()
            .map(|j| format!("†state.n{j}"))
            .collect();
        c(
            json!({"_tool": "work", "ms": self.dur[i], "deps": deps, "_outputPath": format!("†state.n{i}")}),
        )
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

fn fanout_calls(n: usize, ms: u64) -> Vec<Call> {
    let mut v = Vec::with_capacity(n + 2);
    v.push(c(
        json!({"_tool": "work", "ms": 0, "_outputPath": "†state.root"}),
    ));
    for i in 0..n {
        v.push(c(json!({"_tool": "work", "ms": ms, "in": "†state.root", "_outputPath": format!("†state.mid.k{i}")})));
    }
    v.push(c(json!({"_tool": "work", "ms": 0, "all": "†state.mid"})));
    v
}

fn chain_calls(n: usize, ms: u64) -> Vec<Call> {
    (0..n)
        .map(|i| {
            let mut v = json!({"_tool": "work", "ms": ms, "_outputPath": format!("†state.c{i}")});
            if i > 0 {
                v["in"] = json!(format!("†state.c{}", i - 1));
            }
            c(v)
        })
        .collect()
}

/// Runs calls (arriving `gap_ms` apart when non-zero); returns makespan in ms and the actual
/// arrival times in ms since the start.
async fn run(calls: Vec<Call>, gap_ms: u64) -> Run {
    let n = calls.len();
    let sched = Scheduler::new(
        State::new(),
        vec![work_tool()],
        Policy::auto(),
        SchedulerOptions::default(),
    );
    let bus = EventBus::default();
    let arrivals = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let t0 = Instant::now();
    let tt0 = tokio::time::Instant::now();
    let arr = arrivals.clone();
    let stream = futures::stream::iter(calls.into_iter().enumerate())
        .then(move |(k, call)| {
            let arr = arr.clone();
            async move {
                if gap_ms > 0 {
                    tokio::time::sleep_until(tt0 + Duration::from_millis(gap_ms * k as u64)).await;
                    if let Ok(mut a) = arr.lock() {
                        a.push(t0.elapsed().as_secs_f64() * 1000.0);
                    }
                }
                Ok(call)
            }
        })
        .boxed();
    let actual = Arc::new(Mutex::new(Vec::new()));
    let (_state, report) = drive(
        sched,
        stream,
        Arc::new(SleepExec {
            actual: actual.clone(),
        }),
        Arc::new(ScriptedApprover::new()),
        &bus,
        CancellationToken::new(),
        DriveOptions::default(),
    )
    .await;
    let makespan = t0.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(report.count(CallStatus::Done), n, "every call ran");
    let arrivals = arrivals.lock().map(|a| a.clone()).unwrap_or_default();
    let mut durations = vec![0f64; n];
    if let Ok(a) = actual.lock() {
        for &(id, ms) in a.iter() {
            if let Some(d) = durations.get_mut(id as usize) {
                *d = ms;
            }
        }
    }
    Run {
        makespan,
        arrivals,
        durations,
    }
}

/// One measured run.
struct Run {
    makespan: f64,
    /// Arrival of each call (ms since start), for streamed runs.
    arrivals: Vec<f64>,
    /// How long each activity really slept (ms), by call id (= node index).
    durations: Vec<f64>,
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
    let before = LIVE.load(Ordering::Relaxed);
    for (i, call) in calls.enumerate() {
        let id = dagloop::protocol::CallId(i as u64);
        s.handle_into(Input::CallArrived { id, call: Ok(call) }, 0, &mut out);
        out.clear();
    }
    out.shrink_to_fit();
    let after = LIVE.load(Ordering::Relaxed);
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
        s.handle_into(Input::CallArrived { id, call: Ok(call) }, 0, &mut out);
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
    runs.sort_by(|a, b| a.makespan.total_cmp(&b.makespan));
    runs.swap_remove(1)
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

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(512)
        .thread_keep_alive(Duration::from_secs(600))
        .build()
        .expect("runtime");
    let only: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let want = |w: &str| {
        only.as_deref()
            .is_none_or(|o| w.contains(o) || o == "bench")
    };
    rt.block_on(async {
        // Warm the blocking pool so thread creation is not measured.
        run(fanout_calls(120, 5), 0).await;

        if want("fanout") {
            let dag = fanout_dag(100, 50);
            let r = median(|| run((0..dag.dur.len()).map(|i| dag.call(i)).collect(), 0)).await;
            sleep_line("fanout", &dag, &r, None, json!({}));
        }
        if want("chain") {
            let dag = chain_dag(50, 10);
            let r = median(|| run((0..dag.dur.len()).map(|i| dag.call(i)).collect(), 0)).await;
            sleep_line("chain", &dag, &r, None, json!({}));
        }
        if want("layered") {
            let dag = layered(7);
            let r = median(|| run((0..dag.dur.len()).map(|i| dag.call(i)).collect(), 0)).await;
            sleep_line("layered", &dag, &r, None, json!({}));
        }
        if want("fanout0") {
            let n = env_n(100_000);
            let bytes = bytes_per_pending(fanout_calls(n, 0).into_iter(), n);
            let m = median(|| run(fanout_calls(n, 0), 0)).await.makespan;
            let core = core_only(fanout_calls(n, 0));
            line(
                "fanout0",
                n,
                m,
                None,
                Some(m * 1000.0 / (n + 2) as f64),
                Some(bytes),
                json!({"core_only_us_per_call": (core * 1000.0).round() / 1000.0}),
            );
        }
        if want("chain0") {
            let n = env_n(10_000);
            let bytes = bytes_per_pending(chain_calls(n, 0).into_iter(), n);
            let m = median(|| run(chain_calls(n, 0), 0)).await.makespan;
            let core = core_only(chain_calls(n, 0));
            line(
                "chain0",
                n,
                m,
                None,
                Some(m * 1000.0 / n as f64),
                Some(bytes),
                json!({"core_only_us_per_call": (core * 1000.0).round() / 1000.0}),
            );
        }
        if want("streamed") {
            let dag = layered(7);
            let r = median(|| run((0..dag.dur.len()).map(|i| dag.call(i)).collect(), 5)).await;
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
