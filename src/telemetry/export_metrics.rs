//! Metrics over OTLP: the values `metrics` counts (the ones `/metrics` shows) also go to an
//! OpenTelemetry SDK meter, read by a periodic reader (`OTEL_METRIC_EXPORT_INTERVAL`, and on
//! exit) and sent by the OTLP metrics exporter over the protocol the traces use. Model turns use
//! the GenAI conventions' client metrics (`gen_ai.client.operation.duration`,
//! `gen_ai.client.token.usage`); the rest are `dagloop.*`.
//!
//! Deliberately not here: the store's gauges (`dagloop_runs`, runs waiting for a reviewer) —
//! they are the server's view of its store, read when `/metrics` is scraped — or counting
//! anything (`metrics` does).

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Histogram, Meter, MeterProvider as _};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};

use super::TelemetryError;
use super::metrics;

static PROVIDER: OnceLock<SdkMeterProvider> = OnceLock::new();

/// Seconds, from 5 ms to 5 minutes.
const SECONDS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
/// Tokens, in powers of 4 (the GenAI conventions' advice).
const TOKENS: [f64; 13] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0,
];

/// The OTLP name, unit and description of a series of `metrics` (None: not exported).
pub(super) fn describe(name: &str) -> Option<(&'static str, &'static str, &'static str)> {
    Some(match name {
        "dagloop_runs_finished_total" => ("dagloop.runs.finished", "{run}", "Runs ended."),
        "dagloop_calls_total" => ("dagloop.calls", "{call}", "Calls ended."),
        "dagloop_approval_wait_seconds" => (
            "dagloop.approval.wait.duration",
            "s",
            "Time a call waited for its decision.",
        ),
        "dagloop_model_turn_seconds" => (
            "gen_ai.client.operation.duration",
            "s",
            "Model turns: request to the end of the stream.",
        ),
        "dagloop_model_tokens" => (
            "gen_ai.client.token.usage",
            "{token}",
            "Tokens per model turn.",
        ),
        "dagloop_journal_commit_seconds" => (
            "dagloop.journal.commit.duration",
            "s",
            "Journal batch commits.",
        ),
        _ => return None,
    })
}

/// The OTLP attribute name of a `metrics` label.
fn attribute(label: &str) -> &'static str {
    match label {
        "tool" => "gen_ai.tool.name",
        "model" => "gen_ai.request.model",
        "type" => "gen_ai.token.type",
        "decision" => "dagloop.approval.decision",
        "status" => "dagloop.status",
        _ => "dagloop.label",
    }
}

/// A counter's OTLP attributes.
fn attributes(labels: &[(&'static str, String)]) -> Vec<KeyValue> {
    labels
        .iter()
        .map(|(k, v)| KeyValue::new(attribute(k), v.clone()))
        .collect()
}

/// The counter `name` as an observable counter: its totals are read from `metrics` when the
/// reader collects, so counting costs the span worker no SDK work per call.
fn observe(meter: &Meter, name: &'static str) {
    let Some((otel, unit, description)) = describe(name) else {
        return;
    };
    // Kept by the meter provider (it calls the callback on every collection).
    let _counter = meter
        .u64_observable_counter(otel)
        .with_unit(unit)
        .with_description(description)
        .with_callback(move |o| {
            for (labels, n) in metrics::totals(name) {
                o.observe(n, &attributes(&labels));
            }
        })
        .build();
}

/// The histogram of a distribution of `metrics` (None: not exported).
fn histogram(meter: &Meter, name: &'static str) -> Option<Histogram<f64>> {
    let (otel, unit, description) = describe(name)?;
    let bounds = if unit == "s" {
        SECONDS.to_vec()
    } else {
        TOKENS.to_vec()
    };
    Some(
        meter
            .f64_histogram(otel)
            .with_unit(unit)
            .with_description(description)
            .with_boundaries(bounds)
            .build(),
    )
}

/// Installs the meter provider: counters observed from `metrics`' totals, and every value of a
/// distribution `metrics` counts from now on recorded in its histogram.
pub(super) fn install(
    exporter: opentelemetry_otlp::MetricExporter,
    resource: opentelemetry_sdk::Resource,
) -> Result<(), TelemetryError> {
    let reader = PeriodicReader::builder(exporter).build();
    let provider = SdkMeterProvider::builder()
        .with_reader(reader)
        .with_resource(resource)
        .build();
    let meter = provider.meter("dagloop");
    if PROVIDER.set(provider).is_err() {
        return Ok(());
    }
    for counter in ["dagloop_runs_finished_total", "dagloop_calls_total"] {
        observe(&meter, counter);
    }
    let histograms: Mutex<BTreeMap<&'static str, Option<Histogram<f64>>>> = Mutex::default();
    metrics::set_sink(Box::new(move |name, labels, value| {
        let Ok(mut known) = histograms.lock() else {
            return;
        };
        let Some(h) = known.entry(name).or_insert_with(|| histogram(&meter, name)) else {
            return;
        };
        let mut attrs = attributes(labels);
        if name.starts_with("dagloop_model_") {
            attrs.push(KeyValue::new("gen_ai.operation.name", "chat"));
        }
        h.record(value, &attrs);
    }));
    metrics::enable();
    Ok(())
}

/// Sends what the meter holds now (on exit).
pub(super) fn flush() {
    if let Some(p) = PROVIDER.get()
        && let Err(e) = p.force_flush()
    {
        tracing::warn!("OpenTelemetry metrics could not be sent: {e}");
    }
}
