//! The encoder against a reference: what it writes, decoded with `opentelemetry-proto`, is what
//! the OpenTelemetry SDK's own conversion makes of the same span, and its bytes are the ones
//! `prost` writes for that message.

use std::sync::Arc;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span as ProtoSpan;
use proptest::prelude::*;
use prost::Message;

use super::{Batch, Envelope};
use crate::telemetry::export::{convert, scope};
use crate::telemetry::ids::{SpanId, TraceId};
use crate::telemetry::record::{Attrs, Kind, Link, Shared, SpanEvent, SpanRecord, Value};

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        ".{0,40}".prop_map(Value::from),
        ".{0,40}".prop_map(|s: String| Value::Shared(s.into())),
        any::<i64>().prop_map(Value::Int),
        prop_oneof![0..20u64, any::<u64>()].prop_map(Value::Id),
        any::<bool>().prop_map(Value::Bool),
        prop::collection::vec(".{0,12}", 0..4).prop_map(Value::Strs),
    ]
}

const KEYS: [&str; 5] = [
    "gen_ai.tool.name",
    "dagloop.step",
    "",
    "gen_ai.tool.call.arguments",
    "ü.ñ",
];

fn attrs() -> impl Strategy<Value = Attrs> {
    prop::collection::vec((0..KEYS.len(), value()), 0..6)
        .prop_map(|v| v.into_iter().map(|(k, v)| (KEYS[k], v)).collect())
}

fn record() -> impl Strategy<Value = SpanRecord> {
    (
        any::<[u8; 16]>(),
        any::<[u8; 8]>(),
        prop::option::of(any::<[u8; 8]>()),
        ".{0,30}",
        any::<bool>(),
        (0u64..4_000_000_000_000, 0u64..100_000),
        (prop::option::of(attrs()), attrs()),
        prop::collection::vec((0u64..4_000_000_000_000, attrs()), 0..3),
        prop::collection::vec((any::<[u8; 8]>(), attrs()), 0..4),
        (
            prop::option::of(".{0,20}"),
            prop_oneof![Just(0u32), any::<u32>()],
        ),
    )
        .prop_map(
            |(
                trace,
                id,
                parent,
                name,
                client,
                (start, len),
                (shared, attrs),
                events,
                links,
                (error, dropped_links),
            )| {
                SpanRecord {
                    trace: TraceId(trace),
                    id: SpanId(id),
                    parent: parent.map(SpanId),
                    name,
                    kind: if client { Kind::Client } else { Kind::Internal },
                    start,
                    end: start + len,
                    shared: shared.map(|a| Arc::new(Shared::new(a))),
                    attrs,
                    events: events
                        .into_iter()
                        .map(|(at, attrs)| SpanEvent {
                            name: "gen_ai.retry",
                            at,
                            attrs,
                        })
                        .collect(),
                    links: links
                        .into_iter()
                        .map(|(s, attrs)| Link {
                            span: SpanId(s),
                            attrs,
                        })
                        .collect(),
                    dropped_links,
                    error,
                }
            },
        )
}

fn decoded(envelope: &Envelope, batch: &Batch) -> ExportTraceServiceRequest {
    let body = envelope.request(batch);
    match ExportTraceServiceRequest::decode(body.as_slice()) {
        Ok(r) => r,
        Err(e) => panic!("what the encoder wrote does not decode: {e}"),
    }
}

fn reference(s: &SpanRecord) -> ProtoSpan {
    let mut p = ProtoSpan::from(convert(s.clone(), &scope()));
    // The SDK omits an all-zero parent (an invalid id) as the encoder does.
    if p.parent_span_id == [0; 8] {
        p.parent_span_id.clear();
    }
    p
}

proptest! {
    #[test]
    fn every_span_decodes_to_what_the_sdk_would_have_sent(spans in prop::collection::vec(record(), 1..5)) {
        let envelope = Envelope::new(
            &[("service.name".into(), Value::from("svc")), ("n".into(), Value::Int(-3))],
            "dagloop",
            "1.2.3",
        );
        let mut batch = Batch::default();
        // Twice: the second time, shared attributes are copied from their first encoding.
        for s in spans.iter().chain(&spans) {
            batch.push(s);
        }
        prop_assert_eq!(batch.len(), 2 * spans.len());
        let req = decoded(&envelope, &batch);
        // Byte for byte what `prost` writes for the message it decodes to: every length is
        // the shortest varint, wherever the encoder had to move a body to fit it.
        prop_assert_eq!(req.encode_to_vec(), envelope.request(&batch));
        prop_assert_eq!(req.resource_spans.len(), 1);
        let rs = &req.resource_spans[0];
        prop_assert_eq!(rs.scope_spans.len(), 1);
        let got: Vec<ProtoSpan> = rs.scope_spans[0].spans.clone();
        let want: Vec<ProtoSpan> = spans.iter().chain(&spans).map(reference).collect();
        prop_assert_eq!(got, want);
    }
}

#[test]
fn the_envelope_names_the_resource_and_the_scope() {
    use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
    let envelope = Envelope::new(
        &[
            ("service.name".into(), Value::from("billing")),
            (
                "deployment".into(),
                Value::Strs(vec!["a".into(), "b".into()]),
            ),
        ],
        "dagloop",
        "0.1.0",
    );
    let mut batch = Batch::default();
    assert!(batch.is_empty());
    let req = decoded(&envelope, &batch);
    let rs = &req.resource_spans[0];
    let resource = rs.resource.clone().unwrap_or_default();
    let attrs: Vec<(String, Option<V>)> = resource
        .attributes
        .into_iter()
        .map(|kv| (kv.key, kv.value.and_then(|v| v.value)))
        .collect();
    assert_eq!(attrs.len(), 2, "{attrs:?}");
    assert_eq!(
        attrs[0],
        (
            "service.name".into(),
            Some(V::StringValue("billing".into()))
        )
    );
    let scope = rs.scope_spans[0].scope.clone().unwrap_or_default();
    assert_eq!(
        (scope.name.as_str(), scope.version.as_str()),
        ("dagloop", "0.1.0")
    );
    assert!(rs.scope_spans[0].spans.is_empty());
    // A span of the largest kind dagloop makes, many times over: sizes past one byte's varint.
    let big = SpanRecord {
        trace: TraceId([7; 16]),
        id: SpanId([1; 8]),
        parent: Some(SpanId([2; 8])),
        name: "execute_tool fetch".into(),
        kind: Kind::Internal,
        start: 1_700_000_000_000,
        end: 1_700_000_000_050,
        shared: None,
        attrs: vec![(
            "gen_ai.tool.call.arguments",
            Value::from("x".repeat(70_000)),
        )],
        events: Vec::new(),
        links: Vec::new(),
        dropped_links: 0,
        error: Some("tool.failed".into()),
    };
    for _ in 0..3 {
        batch.push(&big);
    }
    let req = decoded(&envelope, &batch);
    assert_eq!(req.encode_to_vec(), envelope.request(&batch));
    assert_eq!(
        req.resource_spans[0].scope_spans[0].spans,
        vec![reference(&big); 3]
    );
}
