//! dagloop's spans as OTLP protobuf bytes, written straight from [`SpanRecord`]: each span is
//! encoded once, as it ends, into the batch being filled ([`Batch`]), and a batch becomes an
//! `ExportTraceServiceRequest` by putting the resource and scope in front of it.
//!
//! Why not the OpenTelemetry SDK's path: it converts each span into the SDK's `SpanData`, then
//! into `opentelemetry-proto`'s message structs (a `String` per attribute key, a `Vec` per
//! value), groups them by resource with a hash map and lets `prost` size every nested message
//! again at each level. On `cargo bench --bench scheduler`'s fan-out that cost 27,000
//! instructions per call on the second core, more than the span builder itself; writing the
//! bytes directly costs a few thousand. The layout is OTLP's `trace.proto`, field numbers
//! included; `prost`'s varint functions write the integers, and a test decodes what is written
//! with `opentelemetry-proto` and compares it with the SDK's own conversion of the same span.
//!
//! Deliberately not here: sending (`send`), or deciding what a span says (`spans`).

use prost::encoding::encoded_len_varint;

use super::ids::{SpanId, TraceId};
use super::record::{Attrs, Kind, Link, SpanEvent, SpanRecord, Value};

/// Protobuf wire types used here.
const VARINT: u64 = 0;
const FIXED64: u64 = 1;
const LEN: u64 = 2;
const FIXED32: u64 = 5;

/// The span flags OTLP's SDKs send for a local, sampled span: `SAMPLED` and
/// `CONTEXT_HAS_IS_REMOTE` (the remote bit itself is clear).
const FLAGS: u32 = 0x01 | 0x100;

/// A base-128 varint, pushed onto the buffer (prost's own writer goes through `BufMut`).
#[inline]
fn encode_varint(mut n: u64, buf: &mut Vec<u8>) {
    // Most are one byte: field keys, and the lengths of names and short values.
    if n < 0x80 {
        buf.push(n as u8);
        return;
    }
    while n >= 0x80 {
        buf.push((n as u8) | 0x80);
        n >>= 7;
    }
    buf.push(n as u8);
}

#[inline]
fn key(buf: &mut Vec<u8>, field: u64, wire: u64) {
    encode_varint((field << 3) | wire, buf);
}

#[inline]
fn key_len(field: u64) -> usize {
    encoded_len_varint(field << 3)
}

/// A length-delimited field's size: key, length, body.
#[inline]
fn delimited_len(field: u64, body: usize) -> usize {
    key_len(field) + encoded_len_varint(body as u64) + body
}

#[inline]
fn bytes(buf: &mut Vec<u8>, field: u64, b: &[u8]) {
    key(buf, field, LEN);
    encode_varint(b.len() as u64, buf);
    buf.extend_from_slice(b);
}

#[inline]
fn header(buf: &mut Vec<u8>, field: u64, body: usize) {
    key(buf, field, LEN);
    encode_varint(body as u64, buf);
}

#[inline]
fn fixed64(buf: &mut Vec<u8>, field: u64, n: u64) {
    key(buf, field, FIXED64);
    buf.extend_from_slice(&n.to_le_bytes());
}

#[inline]
fn fixed32(buf: &mut Vec<u8>, field: u64, n: u32) {
    key(buf, field, FIXED32);
    buf.extend_from_slice(&n.to_le_bytes());
}

fn nanos(ms: u64) -> u64 {
    ms.saturating_mul(1_000_000)
}

/// How many decimal digits `n` takes.
#[inline]
fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// `n`'s decimal digits as a string field.
#[inline]
fn decimal(buf: &mut Vec<u8>, field: u64, mut n: u64) {
    let mut text = [0u8; 20];
    let mut at = text.len();
    loop {
        at -= 1;
        text[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    bytes(buf, field, &text[at..]);
}

/// `AnyValue`'s body.
#[inline]
fn any_len(v: &Value) -> usize {
    match v {
        Value::Str(s) => delimited_len(1, s.len()),
        Value::Shared(s) => delimited_len(1, s.len()),
        Value::Id(n) => delimited_len(1, digits(*n)),
        Value::Bool(_) => key_len(2) + 1,
        // int64 as a varint: a negative number takes ten bytes.
        Value::Int(n) => key_len(3) + encoded_len_varint(*n as u64),
        Value::Strs(list) => delimited_len(5, array_len(list)),
    }
}

/// `ArrayValue`'s body: one `AnyValue` (a string) per item.
fn array_len(list: &[String]) -> usize {
    list.iter()
        .map(|s| delimited_len(1, delimited_len(1, s.len())))
        .sum()
}

#[inline]
fn any(buf: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Str(s) => bytes(buf, 1, s.as_bytes()),
        Value::Shared(s) => bytes(buf, 1, s.as_bytes()),
        Value::Id(n) => decimal(buf, 1, *n),
        Value::Bool(b) => {
            key(buf, 2, VARINT);
            buf.push(u8::from(*b));
        }
        Value::Int(n) => {
            key(buf, 3, VARINT);
            encode_varint(*n as u64, buf);
        }
        Value::Strs(list) => {
            header(buf, 5, array_len(list));
            for s in list {
                header(buf, 1, delimited_len(1, s.len()));
                bytes(buf, 1, s.as_bytes());
            }
        }
    }
}

/// `KeyValue`'s body.
#[inline]
fn kv_len(k: &str, v: &Value) -> usize {
    delimited_len(1, k.len()) + delimited_len(2, any_len(v))
}

/// Attributes as the repeated `KeyValue` field `field`.
fn attrs_len(field: u64, attrs: &[(&'static str, Value)]) -> usize {
    attrs
        .iter()
        .map(|(k, v)| delimited_len(field, kv_len(k, v)))
        .sum()
}

fn attrs(buf: &mut Vec<u8>, field: u64, attrs: &[(&'static str, Value)]) {
    for (k, v) in attrs {
        let value = any_len(v);
        header(
            buf,
            field,
            delimited_len(1, k.len()) + delimited_len(2, value),
        );
        bytes(buf, 1, k.as_bytes());
        header(buf, 2, value);
        any(buf, v);
    }
}

/// `Span.Event`'s body.
fn event_len(e: &SpanEvent) -> usize {
    key_len(1) + 8 + delimited_len(2, e.name.len()) + attrs_len(3, &e.attrs)
}

/// `Span.Link`'s body.
fn link_len(l: &Link) -> usize {
    delimited_len(1, 16) + delimited_len(2, 8) + attrs_len(4, &l.attrs) + key_len(6) + 4
}

/// `Status`'s body: the error's message and code 2 (`ERROR`), or nothing (`UNSET`).
fn status_len(error: Option<&str>) -> usize {
    match error {
        Some("") => key_len(3) + 1,
        Some(m) => delimited_len(2, m.len()) + key_len(3) + 1,
        None => 0,
    }
}

/// The parent as sent: none for a root, and none for an all-zero id (invalid in OpenTelemetry,
/// so the SDKs leave it out too).
fn parent(s: &SpanRecord) -> Option<SpanId> {
    s.parent.filter(|p| p.0 != [0; 8])
}

/// `Span`'s body.
fn span_len(s: &SpanRecord) -> usize {
    let mut n = delimited_len(1, 16) + delimited_len(2, 8);
    if parent(s).is_some() {
        n += delimited_len(4, 8);
    }
    if !s.name.is_empty() {
        n += delimited_len(5, s.name.len());
    }
    n += key_len(6) + 1;
    n += 2 * (key_len(7) + 8);
    n += attrs_len(9, &s.attrs);
    n += s
        .events
        .iter()
        .map(|e| delimited_len(11, event_len(e)))
        .sum::<usize>();
    n += s
        .links
        .iter()
        .map(|l| delimited_len(13, link_len(l)))
        .sum::<usize>();
    if s.dropped_links > 0 {
        n += key_len(14) + encoded_len_varint(u64::from(s.dropped_links));
    }
    n += delimited_len(15, status_len(s.error.as_deref()));
    n + key_len(16) + 4
}

fn span(buf: &mut Vec<u8>, s: &SpanRecord) {
    bytes(buf, 1, &s.trace.0);
    bytes(buf, 2, &s.id.0);
    if let Some(p) = parent(s) {
        bytes(buf, 4, &p.0);
    }
    if !s.name.is_empty() {
        bytes(buf, 5, s.name.as_bytes());
    }
    key(buf, 6, VARINT);
    buf.push(match s.kind {
        Kind::Internal => 1,
        Kind::Client => 3,
    });
    fixed64(buf, 7, nanos(s.start));
    fixed64(buf, 8, nanos(s.end));
    attrs(buf, 9, &s.attrs);
    for e in &s.events {
        header(buf, 11, event_len(e));
        fixed64(buf, 1, nanos(e.at));
        bytes(buf, 2, e.name.as_bytes());
        attrs(buf, 3, &e.attrs);
    }
    for l in &s.links {
        header(buf, 13, link_len(l));
        link(buf, s.trace, l.span, &l.attrs);
    }
    if s.dropped_links > 0 {
        key(buf, 14, VARINT);
        encode_varint(u64::from(s.dropped_links), buf);
    }
    let error = s.error.as_deref();
    header(buf, 15, status_len(error));
    if let Some(m) = error {
        if !m.is_empty() {
            bytes(buf, 2, m.as_bytes());
        }
        key(buf, 3, VARINT);
        buf.push(2);
    }
    fixed32(buf, 16, FLAGS);
}

fn link(buf: &mut Vec<u8>, trace: TraceId, to: SpanId, a: &Attrs) {
    bytes(buf, 1, &trace.0);
    bytes(buf, 2, &to.0);
    attrs(buf, 4, a);
    fixed32(buf, 6, FLAGS);
}

/// Spans encoded as `ScopeSpans.spans` fields, waiting to be sent together.
#[derive(Debug, Default)]
pub struct Batch {
    bytes: Vec<u8>,
    spans: usize,
}

impl Batch {
    /// An empty batch with room for `bytes`.
    pub fn with_capacity(bytes: usize) -> Self {
        Batch {
            bytes: Vec::with_capacity(bytes),
            spans: 0,
        }
    }

    /// Takes what it holds, leaving it empty with the same room (a batch fills to about the
    /// same size every time).
    pub fn take(&mut self) -> Batch {
        std::mem::replace(self, Batch::with_capacity(self.bytes.capacity()))
    }

    /// Appends one span.
    pub fn push(&mut self, s: &SpanRecord) {
        let len = span_len(s);
        self.bytes.reserve(delimited_len(2, len));
        header(&mut self.bytes, 2, len);
        span(&mut self.bytes, s);
        self.spans += 1;
    }

    /// How many spans it holds.
    pub fn len(&self) -> usize {
        self.spans
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.spans == 0
    }
}

/// What every request of this process puts in front of its spans: the resource's attributes
/// and the instrumentation scope, encoded once.
#[derive(Debug, Clone)]
pub struct Envelope {
    resource: Vec<u8>,
    scope: Vec<u8>,
}

impl Envelope {
    /// The envelope for a resource with these attributes and the scope `name`/`version`.
    pub fn new(resource: &[(String, Value)], name: &str, version: &str) -> Self {
        let mut r = Vec::new();
        for (k, v) in resource {
            header(
                &mut r,
                1,
                delimited_len(1, k.len()) + delimited_len(2, any_len(v)),
            );
            bytes(&mut r, 1, k.as_bytes());
            header(&mut r, 2, any_len(v));
            any(&mut r, v);
        }
        let mut scope = Vec::new();
        bytes(&mut scope, 1, name.as_bytes());
        bytes(&mut scope, 2, version.as_bytes());
        Envelope { resource: r, scope }
    }

    /// The `ExportTraceServiceRequest` carrying `batch`.
    pub fn request(&self, batch: &Batch) -> Vec<u8> {
        let scope_spans = delimited_len(1, self.scope.len()) + batch.bytes.len();
        let resource_spans = delimited_len(1, self.resource.len()) + delimited_len(2, scope_spans);
        let mut out = Vec::with_capacity(delimited_len(1, resource_spans));
        header(&mut out, 1, resource_spans);
        header(&mut out, 1, self.resource.len());
        out.extend_from_slice(&self.resource);
        header(&mut out, 2, scope_spans);
        header(&mut out, 1, self.scope.len());
        out.extend_from_slice(&self.scope);
        out.extend_from_slice(&batch.bytes);
        out
    }
}

#[cfg(test)]
mod tests;
