//! `GET /metrics` of `dagloop serve` after a run: the Prometheus text format parses, and the
//! run, its calls, the approval wait, the model turns and the journal commits are counted.

#[path = "common/bin.rs"]
mod bin;
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
