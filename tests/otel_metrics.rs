//! `GET /metrics` of `dagloop serve` after a run: the Prometheus text format parses, and the
//! run, its calls, the approval wait, the model turns and the journal commits are counted. And
//! what `dagloop run` sends over OTLP/HTTP to a receiver on loopback: metrics, and spans with
//! the endpoint, headers and limits the `OTEL_*` variables give.

#[path = "common/bin.rs"]
mod bin;
#[path = "common/otlp.rs"]
mod otlp;
#[path = "common/serve.rs"]
mod serve;

use std::collections::BTreeMap;

use serde_json::json;
use serve::{Server, client, counting_service, create, goal, until};

/// The samples of a text exposition: `name{labels}` → value. Panics on a line that is neither
/// a comment nor a sample.
fn parse(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if line.starts_with("# HELP ") || line.starts_with("# TYPE ") {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("a sample line");
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("a number: {line}"));
        assert!(
            series
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic()),
            "{line}"
        );
        out.insert(series.to_string(), value);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_runs_calls_approvals_model_turns_and_commits() {
    let dir = tempfile::tempdir().expect("tmp");
    let (url, _) = counting_service().await;
    let s = Server::start(&dir.path().join("runs.db"), None);
    // Nobody follows the run: the server parks it while it waits for the decisions and wakes
    // it for them (its journal replayed by a new driver). The model turn that was open when it
    // was parked ends after the wake and is counted then (it once went missing).
    let id = create(&s, &goal(dir.path(), &url, "ask")).await;
    let v = until(&s, &id, |v| {
        v["awaiting"].as_array().is_some_and(|a| a.len() == 2)
    })
    .await;
    let text = client()
        .get(s.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("body");
    let m = parse(&text);
    assert_eq!(
        m.get("dagloop_runs_waiting_for_reviewer"),
        Some(&1.0),
        "{text}"
    );
    assert_eq!(
        m.get("dagloop_runs{status=\"waiting\"}"),
        Some(&1.0),
        "{text}"
    );
    for c in v["awaiting"].as_array().expect("awaiting") {
        let call = c["call_id"].as_u64().expect("call id");
        let r = client()
            .post(s.url(&format!("/runs/{id}/approvals/{call}")))
            .json(&json!({"decision": "approve"}))
            .send()
            .await
            .expect("decide");
        assert!(
            r.status().is_success(),
            "{}",
            r.text().await.unwrap_or_default()
        );
    }
    until(&s, &id, |v| v["status"] == "succeeded").await;
    let text = client()
        .get(s.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("body");
    let m = parse(&text);
    assert_eq!(
        m.get("dagloop_runs{status=\"succeeded\"}"),
        Some(&1.0),
        "{text}"
    );
    assert_eq!(
        m.get("dagloop_runs_waiting_for_reviewer"),
        Some(&0.0),
        "{text}"
    );
    assert_eq!(
        m.get("dagloop_runs_finished_total{status=\"succeeded\"}"),
        Some(&1.0),
        "{text}"
    );
    assert_eq!(
        m.get("dagloop_calls_total{tool=\"step\",status=\"ok\"}"),
        Some(&2.0),
        "{text}"
    );
    assert_eq!(
        m.get("dagloop_approval_wait_seconds_count{decision=\"approve\"}"),
        Some(&2.0),
        "{text}"
    );
    // Both turns of the scripted model, each once, under its name, with their tokens.
    let model = |prefix: &str| -> Vec<f64> {
        m.iter()
            .filter(|(k, _)| k.starts_with(prefix) && k.contains("s.json"))
            .map(|(_, v)| *v)
            .collect()
    };
    assert_eq!(
        model("dagloop_model_turn_seconds_count{model="),
        vec![2.0],
        "{text}"
    );
    assert!(
        model("dagloop_model_turn_seconds_sum{model=")
            .iter()
            .all(|s| *s > 0.0),
        "{text}"
    );
    for kind in ["input", "output"] {
        let sums: Vec<f64> = m
            .iter()
            .filter(|(k, _)| {
                k.starts_with("dagloop_model_tokens_sum{model=")
                    && k.ends_with(&format!("type=\"{kind}\"}}"))
            })
            .map(|(_, v)| *v)
            .collect();
        assert!(sums.len() == 1 && sums[0] > 0.0, "{kind}: {text}");
    }
    // The run was parked and woken, as the comment above says (else this test would not check
    // the wake).
    let stored = dagloop::store::SqliteStore::open(&dir.path().join("runs.db"))
        .and_then(|st| dagloop::store::RunStore::load(&st, &id))
        .expect("the stored run");
    assert!(
        stored
            .journal
            .iter()
            .any(|e| matches!(e.input, dagloop::machine::RunInput::Resumed)),
        "the run was never parked"
    );
    assert!(
        m.get("dagloop_journal_commit_seconds_count")
            .is_some_and(|n| *n > 0.0),
        "{text}"
    );
}

/// Fails with the run's output unless it succeeded.
fn succeeded(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `dagloop run` with `goal` in `dir`, exporting to `endpoint` with these extra variables.
async fn run_exporting(
    dir: &std::path::Path,
    goal: &serde_json::Value,
    endpoint: &str,
    vars: &[(&str, &str)],
) -> std::process::Output {
    let path = dir.join("goal.json");
    std::fs::write(&path, goal.to_string()).expect("goal");
    let mut c = bin::dagloop();
    c.arg("--config")
        .arg(bin::open_config())
        .args(["run", "--json"])
        .arg(&path)
        .current_dir(dir)
        .env("DAGLOOP_STORE", dir.join("runs.db"))
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .env_remove("OTEL_SDK_DISABLED")
        .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
        .env_remove("OTEL_METRICS_EXPORTER");
    for (k, v) in vars {
        c.env(k, v);
    }
    tokio::task::spawn_blocking(move || c.output().expect("run"))
        .await
        .expect("join")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_go_over_otlp_http_when_the_variables_say_so() {
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::metrics::v1::metric::Data;
    use prost::Message;
    let dir = tempfile::tempdir().expect("tmp");
    let (url, _) = counting_service().await;
    let (endpoint, got) = otlp::receiver().await;
    let out = run_exporting(dir.path(), &goal(dir.path(), &url, "auto"), &endpoint, &[]).await;
    succeeded(&out);
    // Sent on exit (the periodic reader's interval is a minute); cumulative, so the last
    // request has everything.
    let got = got.lock().expect("received").clone();
    let (_, kind, body, _) = got
        .iter()
        .rev()
        .find(|(path, _, _, _)| path == "/v1/metrics")
        .unwrap_or_else(|| panic!("no POST /v1/metrics: {got:?}"));
    assert_eq!(kind, "application/x-protobuf");
    let req = ExportMetricsServiceRequest::decode(body.as_slice()).expect("OTLP metrics");
    let metrics: BTreeMap<String, Data> = req
        .resource_metrics
        .iter()
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .filter_map(|m| Some((m.name.clone(), m.data.clone()?)))
        .collect();
    let attr = |attrs: &[opentelemetry_proto::tonic::common::v1::KeyValue], key: &str| {
        attrs
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref())
            .and_then(|v| v.value.clone())
            .map(|v| format!("{v:?}"))
            .unwrap_or_default()
    };
    // Two model turns, by model, and their tokens by type.
    let Some(Data::Histogram(turns)) = metrics.get("gen_ai.client.operation.duration") else {
        panic!("no model turn histogram: {metrics:#?}");
    };
    assert_eq!(turns.data_points.len(), 1, "{turns:?}");
    assert_eq!(turns.data_points[0].count, 2);
    assert!(attr(&turns.data_points[0].attributes, "gen_ai.request.model").contains("s.json"));
    let Some(Data::Histogram(tokens)) = metrics.get("gen_ai.client.token.usage") else {
        panic!("no token histogram: {metrics:#?}");
    };
    let types: Vec<String> = tokens
        .data_points
        .iter()
        .map(|p| attr(&p.attributes, "gen_ai.token.type"))
        .collect();
    assert!(types.iter().any(|t| t.contains("input")), "{types:?}");
    assert!(types.iter().any(|t| t.contains("output")), "{types:?}");
    assert!(
        tokens
            .data_points
            .iter()
            .all(|p| p.sum.unwrap_or(0.0) > 0.0)
    );
    // Two calls of `step`, ok; one run, succeeded; journal commits.
    let Some(Data::Sum(calls)) = metrics.get("dagloop.calls") else {
        panic!("no calls counter: {metrics:#?}");
    };
    assert_eq!(calls.data_points.len(), 1, "{calls:?}");
    assert!(attr(&calls.data_points[0].attributes, "gen_ai.tool.name").contains("step"));
    assert!(attr(&calls.data_points[0].attributes, "dagloop.status").contains("ok"));
    assert!(
        format!("{:?}", calls.data_points[0].value).contains("AsInt(2)"),
        "{calls:?}"
    );
    assert!(
        metrics.contains_key("dagloop.runs.finished"),
        "{metrics:#?}"
    );
    assert!(
        metrics.contains_key("dagloop.journal.commit.duration"),
        "{metrics:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsupported_otlp_protocol_is_refused_with_a_code() {
    let dir = tempfile::tempdir().expect("tmp");
    let (endpoint, got) = otlp::receiver().await;
    let out = run_exporting(
        dir.path(),
        &goal(dir.path(), "http://127.0.0.1:9/step", "auto"),
        &endpoint,
        &[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")],
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("telemetry.bad_variable"), "{stdout}");
    assert!(stdout.contains("OTEL_EXPORTER_OTLP_PROTOCOL"), "{stdout}");
    assert!(got.lock().expect("received").is_empty());
}

/// Spans go where the traces endpoint says, with the operator's headers (percent-decoded) and
/// service name, as OTLP protobuf: one `execute_tool` span per call, under its step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_go_to_the_traces_endpoint_with_the_operators_headers() {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;
    let dir = tempfile::tempdir().expect("tmp");
    let (url, _) = counting_service().await;
    let (endpoint, got) = otlp::receiver().await;
    let traces = format!("{endpoint}/custom/traces");
    let out = run_exporting(
        dir.path(),
        &goal(dir.path(), &url, "auto"),
        "http://127.0.0.1:9",
        &[
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", traces.as_str()),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "x-team=agents, authorization=Bearer%20abc",
            ),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-team=billing"),
            ("OTEL_SERVICE_NAME", "refunds"),
            ("OTEL_METRICS_EXPORTER", "none"),
        ],
    )
    .await;
    succeeded(&out);
    let got = got.lock().expect("received").clone();
    assert!(!got.is_empty(), "nothing was sent");
    let mut tools = Vec::new();
    for (path, kind, body, headers) in &got {
        assert_eq!(path, "/custom/traces");
        assert_eq!(kind, "application/x-protobuf");
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(header("authorization"), Some("Bearer abc"), "{headers:?}");
        assert_eq!(header("x-team"), Some("billing"), "{headers:?}");
        let req = ExportTraceServiceRequest::decode(body.as_slice()).expect("OTLP traces");
        for rs in &req.resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.clone())
                .and_then(|v| v.value);
            assert_eq!(format!("{service:?}"), r#"Some(StringValue("refunds"))"#);
            for s in rs.scope_spans.iter().flat_map(|s| &s.spans) {
                if let Some(t) = s.name.strip_prefix("execute_tool ") {
                    assert!(!s.parent_span_id.is_empty(), "{s:?}");
                    tools.push(t.to_string());
                }
            }
        }
    }
    assert_eq!(tools, ["step", "step"], "{got:?}");
}

/// What dagloop cannot honour is refused before the run, with the variable named: a
/// compression, a batch setting that is not a number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compression_or_a_malformed_batch_setting_is_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let (endpoint, got) = otlp::receiver().await;
    for (var, value) in [
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
        ("OTEL_BSP_SCHEDULE_DELAY", "soon"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "-1"),
    ] {
        let out = run_exporting(
            dir.path(),
            &goal(dir.path(), "http://127.0.0.1:9/step", "auto"),
            &endpoint,
            &[(var, value)],
        )
        .await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(2), "{var}: {stdout}");
        assert!(stdout.contains("telemetry.bad_variable"), "{stdout}");
        assert!(stdout.contains(var), "{stdout}");
    }
    assert!(got.lock().expect("received").is_empty());
}

/// A collector that is not there never holds up a run: the run succeeds, and the spans it
/// could not send are reported as dropped in the log (`RUST_LOG`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_collector_costs_the_spans_not_the_run() {
    let dir = tempfile::tempdir().expect("tmp");
    let (url, counts) = counting_service().await;
    // A port nothing listens on: bound, then closed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let out = run_exporting(
        dir.path(),
        &goal(dir.path(), &url, "auto"),
        &endpoint,
        &[("OTEL_METRICS_EXPORTER", "none"), ("RUST_LOG", "warn")],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{}{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(counts.lock().expect("counts").len(), 2, "both calls ran");
    assert!(stderr.contains("OpenTelemetry spans dropped"), "{stderr}");
    // Said once for the streak of failures, and nowhere else.
    assert_eq!(stderr.matches("did not take them").count(), 1, "{stderr}");
}

/// A fan-in that waited on a fan-out of 130 calls links to 128 of their spans (the
/// OpenTelemetry default, `OTEL_SPAN_LINK_COUNT_LIMIT`) and counts the other two as dropped:
/// without a limit, a fan-in over thousands of calls made a span of megabytes that collectors
/// refuse whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_in_span_keeps_128_links_and_counts_the_rest() {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;
    let dir = tempfile::tempdir().expect("tmp");
    let (url, _) = counting_service().await;
    let (endpoint, got) = otlp::receiver().await;
    let step = json!({"_tool": "step", "_activity": "http", "_http": {"method": "POST", "url": url},
        "type": "object", "properties": {"n": {"type": "integer"}, "all": {}}, "required": ["n"]});
    let mut calls: Vec<serde_json::Value> = (0..130)
        .map(|i| json!({"_tool": "step", "n": i, "_outputPath": format!("†state.mid.k{i}")}))
        .collect();
    calls
        .push(json!({"_tool": "step", "n": 999, "all": "†state.mid", "_outputPath": "†state.end"}));
    let script = json!({"turns": [
        {"solution": {"calls": calls, "output": null}},
        {"solution": {"calls": [], "output": {"done": true}}}
    ]});
    let script_path = dir.path().join("s.json");
    std::fs::write(&script_path, script.to_string()).expect("script");
    let goal = json!({"goal": "fan in", "model": format!("scripted:{}", script_path.display()),
        "output_schema": {"type": "object"}, "tools": [step], "approval": {"policy": "auto"}});
    let out = run_exporting(
        dir.path(),
        &goal,
        &endpoint,
        &[("OTEL_METRICS_EXPORTER", "none")],
    )
    .await;
    succeeded(&out);
    let got = got.lock().expect("received").clone();
    let spans: Vec<_> = got
        .iter()
        .filter(|(p, _, _, _)| p == "/v1/traces")
        .flat_map(|(_, _, body, _)| {
            ExportTraceServiceRequest::decode(body.as_slice())
                .expect("OTLP traces")
                .resource_spans
        })
        .flat_map(|r| r.scope_spans)
        .flat_map(|s| s.spans)
        .filter(|s| s.name == "execute_tool step")
        .collect();
    assert_eq!(spans.len(), 131);
    // The fan-in is the one call that waited on others.
    let linked: Vec<_> = spans.iter().filter(|s| !s.links.is_empty()).collect();
    assert_eq!(linked.len(), 1, "{linked:#?}");
    let fan_in = linked[0];
    assert_eq!(fan_in.links.len(), 128);
    assert_eq!(fan_in.dropped_links_count, 2);
}

/// With content recorded, `OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT` cuts every string attribute
/// to that many characters (a large result would otherwise make a request collectors refuse);
/// the params and the result are both recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn string_attributes_are_cut_to_the_value_length_limit() {
    let dir = tempfile::tempdir().expect("tmp");
    let (url, _) = counting_service().await;
    let (endpoint, got) = otlp::receiver().await;
    let out = run_exporting(
        dir.path(),
        &goal(dir.path(), &url, "auto"),
        &endpoint,
        &[
            ("OTEL_METRICS_EXPORTER", "none"),
            ("DAGLOOP_OTEL_CONTENT", "on"),
            ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "6"),
        ],
    )
    .await;
    succeeded(&out);
    let spans = otlp::spans(&got);
    let calls: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "execute_tool step")
        .collect();
    assert_eq!(calls.len(), 2, "{spans:#?}");
    for c in &calls {
        let args = c.attrs["gen_ai.tool.call.arguments"].as_str().unwrap_or("");
        assert!(args.starts_with(r#"{"n":"#), "{c:#?}");
        assert_eq!(args.chars().count(), 6, "{c:#?}");
        // The result is recorded too, not only the params.
        let result = c
            .attrs
            .get("gen_ai.tool.call.result")
            .and_then(|v| v.as_str());
        assert!(result.is_some_and(|r| !r.is_empty()), "no result: {c:#?}");
    }
    for s in &spans {
        for (k, v) in &s.attrs {
            if let Some(text) = v.as_str() {
                assert!(text.chars().count() <= 6, "{}: {k} = {text}", s.name);
            }
        }
    }
}

/// A server that keeps running sends the spans of a batch that never fills every
/// `OTEL_BSP_SCHEDULE_DELAY`, not only when it exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_server_sends_its_spans_on_schedule() {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;
    let dir = tempfile::tempdir().expect("tmp");
    let (url, _) = counting_service().await;
    let (endpoint, got) = otlp::receiver().await;
    let s = Server::start_with(&dir.path().join("runs.db"), None, |c| {
        c.env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
            .env("OTEL_METRICS_EXPORTER", "none")
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .env("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1000")
            .env_remove("OTEL_SDK_DISABLED")
            .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL");
    });
    let id = create(&s, &goal(dir.path(), &url, "auto")).await;
    until(&s, &id, |v| v["status"] == "succeeded").await;
    // The server is still up and a batch holds 1,000 spans: only the schedule sends these.
    let mut tools = Vec::new();
    for _ in 0..200 {
        let requests = got.lock().expect("received").clone();
        tools.clear();
        for (_, _, body, _) in &requests {
            let req = ExportTraceServiceRequest::decode(body.as_slice()).expect("OTLP traces");
            let spans: Vec<_> = req
                .resource_spans
                .iter()
                .flat_map(|r| &r.scope_spans)
                .flat_map(|s| &s.spans)
                .collect();
            tools.extend(
                spans
                    .iter()
                    .filter(|s| s.name == "execute_tool step")
                    .map(|s| s.name.clone()),
            );
        }
        if tools.len() == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        tools.len(),
        2,
        "the calls' spans never arrived while the server ran"
    );
    drop(s);
}
