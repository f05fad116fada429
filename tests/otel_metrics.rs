//! `GET /metrics` of `dagloop serve` after a run: the Prometheus text format parses, and the
//! run, its calls, the approval wait, the model turns and the journal commits are counted.

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
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Sent on exit (the periodic reader's interval is a minute); cumulative, so the last
    // request has everything.
    let got = got.lock().expect("received").clone();
    let (_, kind, body) = got
        .iter()
        .rev()
        .find(|(path, _, _)| path == "/v1/metrics")
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
