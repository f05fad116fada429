//! Telemetry: every run is a trace. A run's spans are derived from its own events and journal
//! (`spans`), with ids derived from the run id (`ids`), and exported over OTLP when the standard
//! `OTEL_*` variables say so (`export`, feature `otel`); the server's `/metrics` counts the same
//! things (`metrics`), which go over OTLP as well (`export_metrics`); `logs` sets up
//! `RUST_LOG`-filtered logs on stderr.
//!
//! Nothing here runs unless asked: with no exporter installed and metrics off, a run gets no
//! span builder at all, and publishing an event costs one branch more.
//!
//! Deliberately not here: `tracing` spans around the engine's code (the engine's hot path stays
//! as it is), or recording params, results or prompts unless `DAGLOOP_OTEL_CONTENT=on`; header
//! values and secrets are never in events, so they are never in spans.

pub mod feed;
pub mod ids;
#[cfg(feature = "cli")]
pub mod logs;
pub mod metrics;
pub mod record;
pub mod spans;

#[cfg(feature = "otel")]
mod export;
#[cfg(feature = "otel")]
mod export_metrics;
#[cfg(feature = "otel")]
mod grpc;
#[cfg(feature = "otel")]
pub mod otlp;
#[cfg(feature = "otel")]
pub mod send;

use std::sync::{Arc, OnceLock};

pub use feed::SpanFeed;
pub use record::SpanRecord;
pub use spans::{RunSpans, SpanExport};

use crate::machine::{AgentConfig, JournalEntry};

/// The span pipeline of this process: where spans go, whether a trace is kept, and whether
/// content is recorded.
pub struct Pipeline {
    /// Where finished spans go.
    pub export: Arc<dyn SpanExport>,
    /// Whether a trace is kept (`OTEL_TRACES_SAMPLER`), from its id.
    pub sample: Box<dyn Fn(ids::TraceId) -> bool + Send + Sync>,
    /// Record params, results and prompts (`DAGLOOP_OTEL_CONTENT=on`).
    pub content: bool,
    /// Sends what is buffered; called on exit.
    pub flush: Box<dyn Fn() + Send + Sync>,
}

static PIPELINE: OnceLock<Pipeline> = OnceLock::new();

/// Installs the process's span pipeline (once; later calls are ignored and return false).
pub fn install(p: Pipeline) -> bool {
    PIPELINE.set(p).is_ok()
}

/// Whether `DAGLOOP_OTEL_CONTENT` asks for params, results and prompts in spans.
pub fn content_from_env() -> bool {
    std::env::var("DAGLOOP_OTEL_CONTENT").is_ok_and(|v| v.eq_ignore_ascii_case("on"))
}

/// A telemetry set-up that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// An `OTEL_*` variable has a value dagloop cannot use.
    #[error("{var}={value}: {reason}")]
    BadVariable {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// The OTLP exporter could not be built.
    #[error("the OTLP exporter could not be built: {0}")]
    Exporter(String),
}

crate::codes::has_code!(TelemetryError);

impl TelemetryError {
    /// The stable error code.
    pub fn code(&self) -> &'static str {
        match self {
            TelemetryError::BadVariable { .. } => "telemetry.bad_variable",
            TelemetryError::Exporter(_) => "telemetry.exporter",
        }
    }
}

/// Sets up OTLP export from the standard variables, when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set and `OTEL_SDK_DISABLED` is not `true`. True
/// when spans will be exported.
pub fn init_from_env() -> Result<bool, TelemetryError> {
    let set = |v: &str| std::env::var(v).is_ok_and(|s| !s.trim().is_empty());
    if std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || !(set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
    {
        return Ok(false);
    }
    #[cfg(feature = "otel")]
    {
        let p = export::from_env()?;
        Ok(install(p))
    }
    #[cfg(not(feature = "otel"))]
    {
        tracing::warn!("OTEL_EXPORTER_OTLP_ENDPOINT is set but dagloop was built without `otel`");
        Ok(false)
    }
}

/// Installs a pipeline that hands each span to `exporter` as it ends (the SDK's in-memory
/// exporter in tests; any `SpanExporter` an embedding program brings). False when a pipeline
/// was already installed.
#[cfg(feature = "otel")]
pub fn install_exporter<E: opentelemetry_sdk::trace::SpanExporter + 'static>(
    exporter: E,
    content: bool,
) -> bool {
    install(export::with_exporter(exporter, content))
}

/// Sends every span still buffered (the CLI, the server and workers call it on exit).
pub fn flush() {
    // Spans still being made from runs' events first (see `feed`).
    feed::drain_all(std::time::Duration::from_secs(5));
    if let Some(p) = PIPELINE.get() {
        (p.flush)();
    }
}

/// The trace id of a run, as exported (derived from its id: the same in every process).
pub fn trace_id(run_id: &str) -> ids::TraceId {
    ids::trace_id(run_id)
}

/// Reports a whole run from its journal: the journal goes through `machine` (fresh, built by the
/// caller from the run's record: `runs::RunDef::machine`), whose events
/// make the spans (and metrics) a live run's would, with the journal's times. For runs whose
/// driver publishes no events: a Temporal run is reported this way when it ends, by the worker
/// that ends it. Nothing is marked replayed (no process reported any of it before). False when
/// nothing would use it (no pipeline or the trace not sampled, and metrics off).
#[cfg_attr(not(feature = "temporal"), allow(dead_code))]
pub(crate) fn report_journal(
    mut machine: crate::machine::RunMachine,
    journal: &[JournalEntry],
) -> bool {
    let run_id = machine.run_id().to_string();
    let Some(mut spans) = for_run(&run_id, machine.root(), None) else {
        return false;
    };
    let mut out = Vec::new();
    for (i, e) in journal.iter().enumerate() {
        machine.handle_into(e.input.clone(), e.at, &mut out);
        let upto = journal.get(..=i).unwrap_or(journal);
        for a in out.drain(..) {
            if let crate::machine::Action::Emit(ev) = a {
                spans.observe(upto, &ev);
            }
        }
    }
    true
}

/// The span builder of a new or resumed run, or None when nothing would use it (no pipeline or
/// the trace not sampled, and metrics off): the engine then does no telemetry work at all.
pub(crate) fn for_run(
    run_id: &str,
    config: &AgentConfig,
    stored: Option<&[JournalEntry]>,
) -> Option<Box<RunSpans>> {
    let metrics = metrics::enabled();
    let pipeline = PIPELINE.get().filter(|p| (p.sample)(ids::trace_id(run_id)));
    if pipeline.is_none() && !metrics {
        return None;
    }
    Some(Box::new(RunSpans::new(
        run_id,
        config,
        stored.unwrap_or_default(),
        pipeline.map(|p| p.export.clone()),
        metrics,
        pipeline.is_some_and(|p| p.content),
    )))
}
