//! Process-wide counters for `GET /metrics` in the Prometheus text format, fed by the runs'
//! span builders (`spans`) and the journal: runs by status, calls by tool and status, approval
//! waits, model turns by model, journal commit latency, runs waiting for a reviewer.
//!
//! Hand-rolled (a map behind a mutex and a text writer) rather than a metrics crate: a dozen
//! series do not need one. Nothing is counted until [`enable`] is called (the server does, and
//! so does any process exporting over OTLP). Every value of a distribution is also handed to
//! the [`Sink`] when one is set (the OTLP metrics exporter, `export_metrics`), which reads the
//! counters' [`totals`] when it collects.
//!
//! Deliberately not here: labels from anything a user wrote other than tool and model names
//! (never params, results or principals).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

static ENABLED: AtomicBool = AtomicBool::new(false);

/// (metric name, labels) → (count, sum).
type Series = BTreeMap<(&'static str, Vec<(&'static str, String)>), (u64, f64)>;
static SERIES: Mutex<Series> = Mutex::new(BTreeMap::new());

/// `dagloop_calls_total`, counted apart: tool → status → count, so that counting a call (once
/// per call of every run) looks the series up without building its key.
static CALLS: Mutex<BTreeMap<String, BTreeMap<&'static str, u64>>> = Mutex::new(BTreeMap::new());

/// Every series, the calls' included.
fn all_series() -> Series {
    let mut all = match SERIES.lock() {
        Ok(s) => s.clone(),
        Err(_) => return Series::new(),
    };
    if let Ok(calls) = CALLS.lock() {
        for (tool, by_status) in calls.iter() {
            for (status, n) in by_status {
                let labels = vec![("tool", tool.clone()), ("status", (*status).to_string())];
                all.insert(("dagloop_calls_total", labels), (*n, *n as f64));
            }
        }
    }
    all
}

/// Starts counting (the server calls it once).
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// Whether anything is counted.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Takes every value counted: (metric name, labels, value).
pub type Sink = Box<dyn Fn(&'static str, &[(&'static str, String)], f64) + Send + Sync>;
static SINK: OnceLock<Sink> = OnceLock::new();

/// Hands every value counted from now on to `sink` as well (once; false when one was set).
pub fn set_sink(sink: Sink) -> bool {
    SINK.set(sink).is_ok()
}

fn add(name: &'static str, labels: Vec<(&'static str, String)>, value: f64) {
    // Counters are read when metrics are collected ([`totals`]); only distributions need each
    // value as it comes.
    if !name.ends_with("_total")
        && let Some(sink) = SINK.get()
    {
        sink(name, &labels, value);
    }
    if let Ok(mut s) = SERIES.lock() {
        let e = s.entry((name, labels)).or_insert((0, 0.0));
        e.0 += 1;
        e.1 += value;
    }
}

/// Every series of the counter `name` (a `_total` one) with its count so far: what an
/// observable counter reports when metrics are collected, so counting a call costs no
/// exporter work.
pub fn totals(name: &str) -> Vec<(Vec<(&'static str, String)>, u64)> {
    all_series()
        .iter()
        .filter(|((n, _), _)| *n == name)
        .map(|((_, labels), (count, _))| (labels.clone(), *count))
        .collect()
}

/// A run ended with `status`.
pub fn run_finished(status: &str) {
    add(
        "dagloop_runs_finished_total",
        vec![("status", status.into())],
        1.0,
    );
}

/// A call ended with `status` (`ok`, `error`, `timeout`, `rejected`...).
pub fn call(tool: &str, status: &'static str) {
    let Ok(mut calls) = CALLS.lock() else {
        return;
    };
    let by_status = match calls.get_mut(tool) {
        Some(m) => m,
        None => calls.entry(tool.to_string()).or_default(),
    };
    *by_status.entry(status).or_default() += 1;
}

/// A reviewer (or the policy) answered after `ms`.
pub fn approval_wait(ms: u64, decision: &str) {
    add(
        "dagloop_approval_wait_seconds",
        vec![("decision", decision.into())],
        ms as f64 / 1000.0,
    );
}

/// A model turn took `ms` and these tokens.
pub fn model_turn(model: &str, ms: u64, input: u64, output: u64) {
    add(
        "dagloop_model_turn_seconds",
        vec![("model", model.into())],
        ms as f64 / 1000.0,
    );
    add(
        "dagloop_model_tokens",
        vec![("model", model.into()), ("type", "input".into())],
        input as f64,
    );
    add(
        "dagloop_model_tokens",
        vec![("model", model.into()), ("type", "output".into())],
        output as f64,
    );
}

/// A journal batch was committed in `secs`.
pub fn journal_commit(secs: f64) {
    if enabled() {
        add("dagloop_journal_commit_seconds", Vec::new(), secs);
    }
}

fn labels(l: &[(&'static str, String)], extra: Option<(&str, &str)>) -> String {
    let mut parts: Vec<String> = l
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    if let Some((k, v)) = extra {
        parts.push(format!("{k}=\"{v}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The metrics in the Prometheus text exposition format (0.0.4); `runs` are the runs the
/// caller knows by status (the server's store), as a gauge.
pub fn render(runs: &[(String, u64)]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# HELP dagloop_runs Runs by status.");
    let _ = writeln!(out, "# TYPE dagloop_runs gauge");
    for (status, n) in runs {
        let _ = writeln!(out, "dagloop_runs{{status=\"{}\"}} {n}", escape(status));
    }
    let _ = writeln!(
        out,
        "# HELP dagloop_runs_waiting_for_reviewer Runs with a call awaiting a decision."
    );
    let _ = writeln!(out, "# TYPE dagloop_runs_waiting_for_reviewer gauge");
    let _ = writeln!(
        out,
        "dagloop_runs_waiting_for_reviewer {}",
        // The store's `waiting` runs (parked ones and other processes' included).
        runs.iter()
            .find(|(status, _)| status == "waiting")
            .map_or(0, |(_, n)| *n)
    );
    let series = all_series();
    let mut last = "";
    for ((name, l), (count, sum)) in series.iter() {
        let counter = name.ends_with("_total");
        if *name != last {
            let kind = if counter { "counter" } else { "summary" };
            let _ = writeln!(out, "# TYPE {name} {kind}");
            last = name;
        }
        if counter {
            let _ = writeln!(out, "{name}{} {count}", labels(l, None));
        } else {
            let _ = writeln!(out, "{name}_count{} {count}", labels(l, None));
            let _ = writeln!(out, "{name}_sum{} {sum}", labels(l, None));
        }
    }
    out
}
