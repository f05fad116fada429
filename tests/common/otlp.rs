//! A small OTLP/HTTP receiver on loopback for the telemetry tests: it takes every POST and keeps
//! it, and decodes the spans it was sent.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};

/// One request the receiver got: (path, content type, body, every header as name and value).
pub type Request = (String, String, Vec<u8>, Vec<(String, String)>);

/// What the receiver got.
pub type Received = Arc<Mutex<Vec<Request>>>;

/// Starts a receiver; returns its base URL (for `OTEL_EXPORTER_OTLP_ENDPOINT`) and what it gets.
pub async fn receiver() -> (String, Received) {
    use axum::extract::{OriginalUri, State};
    let got: Received = Default::default();
    let app = axum::Router::new()
        .fallback(axum::routing::post(
            |State(got): State<Received>,
             OriginalUri(uri): OriginalUri,
             headers: axum::http::HeaderMap,
             body: axum::body::Bytes| async move {
                let kind = headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                let all = headers
                    .iter()
                    .map(|(n, v)| {
                        (
                            n.to_string(),
                            String::from_utf8_lossy(v.as_bytes()).into_owned(),
                        )
                    })
                    .collect();
                got.lock().expect("received").push((
                    uri.path().to_string(),
                    kind,
                    body.to_vec(),
                    all,
                ));
                ""
            },
        ))
        .with_state(got.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, got)
}

/// One span as sent: its name, ids (hex), parent (hex, empty for a root) and attributes (as
/// JSON: strings, integers, booleans, arrays of strings).
#[derive(Debug, Clone)]
pub struct Span {
    pub name: String,
    pub trace: String,
    pub id: String,
    pub parent: String,
    pub attrs: serde_json::Map<String, serde_json::Value>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn json_of(v: &opentelemetry_proto::tonic::common::v1::AnyValue) -> serde_json::Value {
    use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
    match &v.value {
        Some(V::StringValue(s)) => serde_json::json!(s),
        Some(V::IntValue(n)) => serde_json::json!(n),
        Some(V::BoolValue(b)) => serde_json::json!(b),
        Some(V::DoubleValue(f)) => serde_json::json!(f),
        Some(V::ArrayValue(a)) => serde_json::Value::Array(a.values.iter().map(json_of).collect()),
        _ => serde_json::Value::Null,
    }
}

/// Every span in the `/v1/traces` requests received so far.
pub fn spans(got: &Received) -> Vec<Span> {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;
    let got = got.lock().expect("received").clone();
    let mut out = Vec::new();
    for (path, kind, body, _) in got.iter().filter(|(p, _, _, _)| p == "/v1/traces") {
        assert_eq!(kind, "application/x-protobuf", "{path}");
        let req = ExportTraceServiceRequest::decode(body.as_slice()).expect("OTLP traces");
        for s in req
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
        {
            out.push(Span {
                name: s.name.clone(),
                trace: hex(&s.trace_id),
                id: hex(&s.span_id),
                parent: hex(&s.parent_span_id),
                attrs: s
                    .attributes
                    .iter()
                    .filter_map(|kv| Some((kv.key.clone(), json_of(kv.value.as_ref()?))))
                    .collect(),
            });
        }
    }
    out
}
