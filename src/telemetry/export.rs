//! OTLP export from the standard variables: the endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`, or
//! `..._TRACES_ENDPOINT`), protocol (`OTEL_EXPORTER_OTLP_PROTOCOL`: `http/protobuf` over the
//! project's reqwest and rustls, or `grpc` through tonic, plaintext HTTP/2), headers, timeout,
//! service name (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`), sampler
//! (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`) and batching (`OTEL_BSP_*`). Spans are
//! encoded and sent by dagloop (`otlp`, `send`, `grpc`); metrics go through the OpenTelemetry
//! SDK's exporter (`export_metrics`). `convert` turns a span into the SDK's `SpanData` for a
//! program that brings its own SDK exporter ([`super::install_exporter`]).
//!
//! Deliberately not here: `http/json`, gRPC over TLS, compression (all refused with
//! `telemetry.bad_variable`), or building spans (`spans`).

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks, SpanProcessor};

use super::otlp::Envelope;
use super::record::{self, SpanRecord};
use super::{Pipeline, SpanExport, TelemetryError, ids, send};

/// OTLP over HTTP through the project's reqwest client. The span sender (`send`) and the SDK's
/// metrics reader call it from their own threads, outside any tokio runtime: the client runs on
/// a small runtime of its own, made on first use.
#[derive(Debug, Default)]
struct Client {
    inner: OnceLock<Option<(tokio::runtime::Runtime, reqwest::Client)>>,
}

impl Client {
    fn get(&self) -> Option<&(tokio::runtime::Runtime, reqwest::Client)> {
        self.inner
            .get_or_init(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .ok()?;
                let client = crate::net::builder()
                    .timeout(Duration::from_secs(10))
                    .build()
                    .ok()?;
                Some((rt, client))
            })
            .as_ref()
    }

    async fn send(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let Some((rt, client)) = self.get() else {
            return Err("the OTLP HTTP client could not be built".into());
        };
        let request = reqwest::Request::try_from(request.map(reqwest::Body::from))?;
        let response = rt.block_on(async {
            let r = client.execute(request).await?;
            let status = r.status();
            let body = r.bytes().await?;
            Ok::<_, reqwest::Error>((status, body))
        })?;
        Ok(Response::builder().status(response.0).body(response.1)?)
    }
}

impl Client {
    /// POSTs `body` to `url`: Ok when the collector answered with a success status.
    fn post(
        &self,
        url: &str,
        headers: reqwest::header::HeaderMap,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<(), String> {
        let Some((rt, client)) = self.get() else {
            return Err("the OTLP HTTP client could not be built".into());
        };
        rt.block_on(async {
            let r = client
                .post(url)
                .headers(headers)
                .timeout(timeout)
                .body(body)
                .send()
                .await
                .map_err(|e| format!("{url}: {e}"))?;
            let status = r.status();
            if status.is_success() {
                return Ok(());
            }
            let text = r.text().await.unwrap_or_default();
            let text: String = text.chars().take(200).collect();
            Err(format!("{url} answered {status}: {text}"))
        })
    }
}

impl HttpClient for Client {
    fn send_bytes<'a, 'b>(
        &'a self,
        request: Request<Bytes>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'b>>
    where
        'a: 'b,
        Self: 'b,
    {
        Box::pin(self.send(request))
    }
}

fn time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn kv(attrs: record::Attrs) -> Vec<KeyValue> {
    attrs
        .into_iter()
        .map(|(k, v)| match v {
            record::Value::Str(s) => KeyValue::new(k, s.into_owned()),
            record::Value::Shared(s) => KeyValue::new(k, s.to_string()),
            record::Value::Id(n) => KeyValue::new(k, n.to_string()),
            record::Value::Int(n) => KeyValue::new(k, n),
            record::Value::Bool(b) => KeyValue::new(k, b),
            record::Value::Strs(list) => KeyValue::new(
                k,
                opentelemetry::Value::Array(opentelemetry::Array::String(
                    list.into_iter().map(Into::into).collect(),
                )),
            ),
        })
        .collect()
}

fn context(trace: ids::TraceId, span: ids::SpanId) -> SpanContext {
    SpanContext::new(
        TraceId::from_bytes(trace.0),
        SpanId::from_bytes(span.0),
        TraceFlags::SAMPLED,
        false,
        TraceState::NONE,
    )
}

/// A dagloop span as the SDK's exporters take it.
pub(super) fn convert(s: SpanRecord, scope: &InstrumentationScope) -> SpanData {
    let trace = s.trace;
    let mut events = SpanEvents::default();
    events.events = s
        .events
        .into_iter()
        .map(|e| opentelemetry::trace::Event::new(e.name, time(e.at), kv(e.attrs), 0))
        .collect();
    let mut links = SpanLinks::default();
    links.dropped_count = s.dropped_links;
    links.links = s
        .links
        .into_iter()
        .map(|l| opentelemetry::trace::Link::new(context(trace, l.span), kv(l.attrs), 0))
        .collect();
    SpanData {
        span_context: context(trace, s.id),
        parent_span_id: s
            .parent
            .map_or(SpanId::INVALID, |p| SpanId::from_bytes(p.0)),
        parent_span_is_remote: false,
        span_kind: match s.kind {
            record::Kind::Internal => SpanKind::Internal,
            record::Kind::Client => SpanKind::Client,
        },
        name: Cow::Owned(s.name),
        start_time: time(s.start),
        end_time: time(s.end),
        attributes: kv(match s.shared {
            Some(shared) => shared.attrs().iter().cloned().chain(s.attrs).collect(),
            None => s.attrs,
        }),
        dropped_attributes_count: 0,
        events,
        links,
        status: match s.error {
            Some(e) => Status::Error {
                description: Cow::Owned(e),
            },
            None => Status::Unset,
        },
        instrumentation_scope: scope.clone(),
    }
}

/// The instrumentation scope of dagloop's spans.
pub(super) fn scope() -> InstrumentationScope {
    InstrumentationScope::builder("dagloop")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}

fn bad(var: &'static str, value: &str, reason: &str) -> TelemetryError {
    TelemetryError::BadVariable {
        var,
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

/// `OTEL_TRACES_SAMPLER` (and its `_ARG`) as a decision on a trace id. A run is a whole trace
/// (its spans have no remote parent), so the parent-based samplers decide as their root one.
fn sampler() -> Result<Box<dyn Fn(ids::TraceId) -> bool + Send + Sync>, TelemetryError> {
    let name = std::env::var("OTEL_TRACES_SAMPLER").unwrap_or_default();
    let arg = std::env::var("OTEL_TRACES_SAMPLER_ARG").unwrap_or_default();
    let ratio = || -> Result<f64, TelemetryError> {
        if arg.trim().is_empty() {
            return Ok(1.0);
        }
        arg.trim()
            .parse::<f64>()
            .ok()
            .filter(|r| r.is_finite())
            .map(|r| r.clamp(0.0, 1.0))
            .ok_or_else(|| bad("OTEL_TRACES_SAMPLER_ARG", &arg, "not a number from 0 to 1"))
    };
    Ok(match name.trim() {
        "" | "always_on" | "parentbased_always_on" => Box::new(|_| true),
        "always_off" | "parentbased_always_off" => Box::new(|_| false),
        "traceidratio" | "parentbased_traceidratio" => {
            let r = ratio()?;
            Box::new(move |t| keep(t, r))
        }
        other => {
            return Err(bad(
                "OTEL_TRACES_SAMPLER",
                other,
                "dagloop knows always_on, always_off, traceidratio and their parentbased_ forms",
            ));
        }
    })
}

/// The trace-id ratio rule of the OpenTelemetry SDKs: the id's low 8 bytes, as a number below
/// 2^63, under `ratio` of that range.
pub(super) fn keep(t: ids::TraceId, ratio: f64) -> bool {
    let mut low = [0u8; 8];
    low.copy_from_slice(&t.0[8..]);
    let n = u64::from_be_bytes(low) >> 1;
    (n as f64) < ratio * (1u64 << 63) as f64
}

/// How OTLP is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    /// `http/protobuf`.
    Http,
    /// `grpc` (plaintext HTTP/2).
    Grpc,
}

/// The transport of a signal: its own `OTEL_EXPORTER_OTLP_{SIGNAL}_PROTOCOL`, else the general
/// one; an unknown value is refused, never ignored.
fn transport(signal: &'static str) -> Result<Transport, TelemetryError> {
    let (var, value) = either(signal, "OTEL_EXPORTER_OTLP_PROTOCOL");
    let value = value.unwrap_or_default();
    match value.trim() {
        "" | "http/protobuf" => Ok(Transport::Http),
        "grpc" => {
            let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").unwrap_or_default();
            if endpoint.trim().starts_with("https:") {
                return Err(bad(
                    "OTEL_EXPORTER_OTLP_ENDPOINT",
                    &endpoint,
                    "dagloop's gRPC export is plaintext (http://) only; use http/protobuf for TLS",
                ));
            }
            Ok(Transport::Grpc)
        }
        other => Err(bad(
            var,
            other,
            "dagloop exports http/protobuf and grpc (not http/json)",
        )),
    }
}

/// The runtime tonic's channels live on: their own (one thread), so export works from the
/// SDK's threads and on exit, after the program's runtime has gone.
fn grpc_runtime() -> Result<&'static tokio::runtime::Runtime, TelemetryError> {
    static RT: OnceLock<Option<tokio::runtime::Runtime>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("dagloop-otlp-grpc")
            .enable_all()
            .build()
            .ok()
    })
    .as_ref()
    .ok_or_else(|| TelemetryError::Exporter("no runtime for the gRPC exporter".into()))
}

fn built<T>(r: Result<T, opentelemetry_otlp::ExporterBuildError>) -> Result<T, TelemetryError> {
    r.map_err(|e| TelemetryError::Exporter(e.to_string()))
}

fn metric_exporter(t: Transport) -> Result<opentelemetry_otlp::MetricExporter, TelemetryError> {
    let b = opentelemetry_otlp::MetricExporter::builder();
    built(match t {
        Transport::Http => b
            .with_http()
            .with_http_client(Client::default())
            .with_protocol(Protocol::HttpBinary)
            .build(),
        Transport::Grpc => {
            let _rt = grpc_runtime()?.enter();
            b.with_tonic().build()
        }
    })
}

/// Spans that may wait to be sent when `OTEL_BSP_MAX_QUEUE_SIZE` does not say: the SDKs' 2,048
/// dropped spans when a fan-out of thousands of calls ended within a second (a tenth of them in
/// `cargo bench --bench scheduler`'s fan-out of 100,000), so dagloop allows more. They wait
/// encoded, about 300 bytes each.
const QUEUE: usize = 16_384;

/// A whole-number `OTEL_*` variable, `default` when unset; anything else is refused.
fn number(var: &'static str, default: u64) -> Result<u64, TelemetryError> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse::<u64>()
            .map_err(|_| bad(var, &v, "not a whole number")),
        _ => Ok(default),
    }
}

/// The signal's own variable when set, else the general one.
fn either(signal: &'static str, general: &'static str) -> (&'static str, Option<String>) {
    for var in [signal, general] {
        if let Ok(v) = std::env::var(var)
            && !v.trim().is_empty()
        {
            return (var, Some(v));
        }
    }
    (general, None)
}

/// The batching of spans: the `OTEL_BSP_*` variables, with dagloop's queue size by default.
fn batch_settings() -> Result<send::Settings, TelemetryError> {
    Ok(send::Settings {
        batch: usize::try_from(number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)?).unwrap_or(512),
        queue: usize::try_from(number("OTEL_BSP_MAX_QUEUE_SIZE", QUEUE as u64)?).unwrap_or(QUEUE),
        // At least a millisecond: 0 would have the sending thread spin.
        delay: Duration::from_millis(number("OTEL_BSP_SCHEDULE_DELAY", 5_000)?.max(1)),
        links: usize::try_from(number(
            "OTEL_SPAN_LINK_COUNT_LIMIT",
            super::spans::LINK_LIMIT as u64,
        )?)
        .unwrap_or(super::spans::LINK_LIMIT),
        values: match either(
            "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
            "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
        ) {
            (var, Some(_)) => Some(usize::try_from(number(var, 0)?).unwrap_or(usize::MAX)),
            (_, None) => None,
        },
    })
}

/// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` or `OTEL_EXPORTER_OTLP_TIMEOUT`, in ms (10 s).
fn timeout() -> Result<Duration, TelemetryError> {
    let (var, _) = either(
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    );
    Ok(Duration::from_millis(number(var, 10_000)?))
}

/// The headers of every request: `OTEL_EXPORTER_OTLP_HEADERS`, then
/// `OTEL_EXPORTER_OTLP_TRACES_HEADERS` (which wins for a name both set), as `name=value` pairs
/// separated by commas, percent-decoded.
fn headers() -> Result<Vec<(String, String)>, TelemetryError> {
    let mut out: Vec<(String, String)> = Vec::new();
    for var in [
        "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    ] {
        let Ok(value) = std::env::var(var) else {
            continue;
        };
        for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let decode = |s: &str| {
                percent_encoding::percent_decode_str(s.trim())
                    .decode_utf8()
                    .map(|c| c.into_owned())
            };
            let (name, val) = pair
                .split_once('=')
                .and_then(|(n, v)| Some((decode(n).ok()?, decode(v).ok()?)))
                .filter(|(n, _)| !n.is_empty())
                .ok_or_else(|| bad(var, "(not shown)", "expected name=value pairs"))?;
            out.retain(|(n, _)| !n.eq_ignore_ascii_case(&name));
            out.push((name, val));
        }
    }
    Ok(out)
}

/// dagloop sends OTLP uncompressed; a compression it was asked for is refused, not ignored.
fn no_compression() -> Result<(), TelemetryError> {
    let (var, value) = either(
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
        "OTEL_EXPORTER_OTLP_COMPRESSION",
    );
    match value {
        Some(v) if !v.trim().eq_ignore_ascii_case("none") => Err(bad(
            var,
            &v,
            "dagloop sends OTLP uncompressed (none is the only value it takes)",
        )),
        _ => Ok(()),
    }
}

/// Where spans go: the traces endpoint as given, else the general one (with `/v1/traces` for
/// HTTP), else the collector's default address on this machine.
fn traces_endpoint(t: Transport) -> String {
    if let Ok(url) = std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        && !url.trim().is_empty()
    {
        return url.trim().to_string();
    }
    let base = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    match t {
        Transport::Http => format!(
            "{}/v1/traces",
            base.as_deref()
                .unwrap_or("http://localhost:4318")
                .trim_end_matches('/')
        ),
        Transport::Grpc => base.unwrap_or_else(|| "http://localhost:4317".into()),
    }
}

/// How a request of spans is sent.
fn traces_sender(t: Transport) -> Result<send::Sender, TelemetryError> {
    let url = traces_endpoint(t);
    let headers = headers()?;
    let timeout = timeout()?;
    match t {
        Transport::Http => {
            let mut map = reqwest::header::HeaderMap::new();
            for (n, v) in &headers {
                let name = reqwest::header::HeaderName::from_bytes(n.as_bytes());
                let value = reqwest::header::HeaderValue::from_str(v);
                let (Ok(name), Ok(value)) = (name, value) else {
                    return Err(bad(
                        "OTEL_EXPORTER_OTLP_HEADERS",
                        n,
                        "not a valid HTTP header",
                    ));
                };
                map.insert(name, value);
            }
            map.insert(
                reqwest::header::CONTENT_TYPE,
                reqwest::header::HeaderValue::from_static("application/x-protobuf"),
            );
            let client = Client::default();
            Ok(Box::new(move |body| {
                client.post(&url, map.clone(), body, timeout)
            }))
        }
        Transport::Grpc => super::grpc::sender(&url, &headers, timeout, grpc_runtime()?),
    }
}

/// The resource's attributes as the span envelope carries them.
fn resource_attrs(resource: &opentelemetry_sdk::Resource) -> Vec<(String, record::Value)> {
    resource
        .iter()
        .map(|(k, v)| {
            let v = match v {
                opentelemetry::Value::String(s) => record::Value::text(s.as_str()),
                opentelemetry::Value::I64(n) => record::Value::Int(*n),
                opentelemetry::Value::Bool(b) => record::Value::Bool(*b),
                other => record::Value::from(other.to_string()),
            };
            (k.to_string(), v)
        })
        .collect()
}

/// The pipeline the standard variables describe; metrics go over OTLP as well unless
/// `OTEL_METRICS_EXPORTER=none`.
pub(super) fn from_env() -> Result<Pipeline, TelemetryError> {
    let traces = transport("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")?;
    no_compression()?;
    let sample = sampler()?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "dagloop".into()))
        .build();
    let metrics_off =
        std::env::var("OTEL_METRICS_EXPORTER").is_ok_and(|v| v.trim().eq_ignore_ascii_case("none"));
    if !metrics_off {
        let t = transport("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")?;
        super::export_metrics::install(metric_exporter(t)?, resource.clone())?;
    }
    let envelope = Envelope::new(
        &resource_attrs(&resource),
        "dagloop",
        env!("CARGO_PKG_VERSION"),
    );
    let exporter = send::Otlp::start(batch_settings()?, envelope, traces_sender(traces)?)
        .map_err(|e| TelemetryError::Exporter(format!("no thread to send spans from: {e}")))?;
    let exporter = Arc::new(exporter);
    let flusher = exporter.clone();
    let limit = timeout()?.saturating_add(Duration::from_secs(1));
    Ok(Pipeline {
        export: exporter,
        sample,
        content: super::content_from_env(),
        flush: Box::new(move || {
            flusher.flush(limit);
            super::export_metrics::flush();
        }),
    })
}

/// Spans straight into `exporter`, one at a time (tests use the SDK's in-memory exporter).
pub(super) fn with_exporter<E: opentelemetry_sdk::trace::SpanExporter + 'static>(
    exporter: E,
    content: bool,
) -> Pipeline {
    let processor = Arc::new(Simple {
        processor: opentelemetry_sdk::trace::SimpleSpanProcessor::new(exporter),
        scope: scope(),
    });
    let flusher = processor.clone();
    Pipeline {
        export: processor,
        sample: Box::new(|_| true),
        content,
        flush: Box::new(move || {
            let _ = flusher.processor.force_flush();
        }),
    }
}

struct Simple<E: opentelemetry_sdk::trace::SpanExporter> {
    processor: opentelemetry_sdk::trace::SimpleSpanProcessor<E>,
    scope: InstrumentationScope,
}

impl<E: opentelemetry_sdk::trace::SpanExporter + 'static> SpanExport for Simple<E> {
    fn export(&self, span: &SpanRecord) {
        self.processor.on_end(convert(span.clone(), &self.scope));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ratio_sampler_keeps_about_its_share_and_is_stable() {
        let kept = (0..2000)
            .filter(|i| keep(ids::trace_id(&format!("run-{i}")), 0.25))
            .count();
        assert!((350..650).contains(&kept), "{kept}");
        assert!(keep(ids::trace_id("run-x"), 1.0));
        assert!(!keep(ids::trace_id("run-x"), 0.0));
    }
}
