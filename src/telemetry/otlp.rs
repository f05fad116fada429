//! dagloop's spans as OTLP protobuf bytes, written straight from [`SpanRecord`]: each span is
//! encoded once, as it ends, into the batch being filled ([`Batch`]), and a batch becomes an
//! `ExportTraceServiceRequest` by putting the resource and scope in front of it.
//!
//! Why not the OpenTelemetry SDK's path: it converts each span into the SDK's `SpanData`, then
//! into `opentelemetry-proto`'s message structs (a `String` per attribute key, a `Vec` per
//! value), groups them by resource with a hash map and lets `prost` size every nested message
//! again at each level. On `cargo bench --bench scheduler`'s fan-out that cost 27,000
//! instructions per call on the second core, more than the span builder itself; writing the
//! bytes directly costs about 1,600 per call span. Each span is written in one pass, each
//! nested message's length filled in when its body is done ([`open`], [`close`]), and
//! attributes that many spans share ([`Shared`]) are encoded once and copied. The layout is
//! OTLP's `trace.proto`, field numbers included. A property test decodes what is written with
//! `opentelemetry-proto`, compares it with the SDK's own conversion of the same span, and
//! checks that the bytes are exactly what `prost` writes for that message.
//!
//! Deliberately not here: sending (`send`), or deciding what a span says (`spans`).

use prost::encoding::encoded_len_varint;

use super::ids::{SpanId, TraceId};
use super::record::{Kind, Link, Shared, SpanEvent, SpanRecord, Value};

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

/// A `fixed64` field; left out when it is 0, proto3's default, as `prost` leaves it out.
#[inline]
fn fixed64(buf: &mut Vec<u8>, field: u64, n: u64) {
    if n == 0 {
        return;
    }
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

/// Starts a length-delimited field whose body is written next, leaving `room` bytes for its
/// length; returns where the body starts, for [`close`].
#[inline]
fn open(buf: &mut Vec<u8>, field: u64, room: usize) -> usize {
    key(buf, field, LEN);
    for _ in 0..room {
        buf.push(0);
    }
    buf.len()
}

/// Ends the field [`open`] started at `start` with `room` bytes for its length: writes the
/// body's length there, first moving the body when its length takes more or fewer bytes than
/// that. One pass over a span instead of one to size each nested message and one to write it;
/// the few moves (a span under 128 bytes or over 16 KiB, an attribute past 127 bytes) cost less
/// than the sizing did.
#[inline]
fn close(buf: &mut Vec<u8>, start: usize, room: usize) {
    let len = buf.len() - start;
    // Most bodies (an attribute, a link) fit the one byte left for them.
    if room == 1 && len < 0x80 {
        if let Some(b) = buf.get_mut(start - 1) {
            *b = len as u8;
        }
        return;
    }
    resize_length(buf, start, room, len);
}

/// [`close`] for a body whose length does not take `room` bytes.
fn resize_length(buf: &mut Vec<u8>, start: usize, room: usize, len: usize) {
    let need = encoded_len_varint(len as u64);
    if need > room {
        buf.resize(buf.len() + need - room, 0);
        buf.copy_within(start..start + len, start + need - room);
    } else if need < room {
        buf.copy_within(start..start + len, start + need - room);
        buf.truncate(buf.len() - (room - need));
    }
    let mut n = len as u64;
    if let Some(at) = buf.get_mut(start - room..start - room + need) {
        let last = need - 1;
        for (i, b) in at.iter_mut().enumerate() {
            *b = (n as u8 & 0x7f) | if i < last { 0x80 } else { 0 };
            n >>= 7;
        }
    }
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

/// An `AnyValue` (its body).
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
            // int64 as a varint: a negative number takes ten bytes.
            key(buf, 3, VARINT);
            encode_varint(*n as u64, buf);
        }
        Value::Strs(list) => {
            let array = open(buf, 5, 1);
            for s in list {
                let item = open(buf, 1, 1);
                bytes(buf, 1, s.as_bytes());
                close(buf, item, 1);
            }
            close(buf, array, 1);
        }
    }
}

/// Attributes as the repeated `KeyValue` field `field`.
fn attrs(buf: &mut Vec<u8>, field: u64, attrs: &[(&'static str, Value)]) {
    for (k, v) in attrs {
        let kv = open(buf, field, 1);
        // An empty key is proto3's default, left out.
        if !k.is_empty() {
            bytes(buf, 1, k.as_bytes());
        }
        let value = open(buf, 2, 1);
        any(buf, v);
        close(buf, value, 1);
        close(buf, kv, 1);
    }
}

/// Shared attributes as `Span.attributes` fields, encoded the first time and copied after.
fn shared(s: Option<&Shared>) -> &[u8] {
    s.map_or(&[], |s| {
        s.encoded(|a| {
            let mut buf = Vec::new();
            attrs(&mut buf, 9, a);
            buf
        })
    })
}

/// The parent as sent: none for a root, and none for an all-zero id (invalid in OpenTelemetry,
/// so the SDKs leave it out too).
fn parent(s: &SpanRecord) -> Option<SpanId> {
    s.parent.filter(|p| p.0 != [0; 8])
}

/// `Span`'s body.
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
    buf.extend_from_slice(shared(s.shared.as_deref()));
    attrs(buf, 9, &s.attrs);
    for e in &s.events {
        event(buf, e);
    }
    for l in &s.links {
        link(buf, s.trace, l);
    }
    if s.dropped_links > 0 {
        key(buf, 14, VARINT);
        encode_varint(u64::from(s.dropped_links), buf);
    }
    // `Status`: the error's message and code 2 (`ERROR`), or nothing (`UNSET`).
    let status = open(buf, 15, 1);
    if let Some(m) = s.error.as_deref() {
        if !m.is_empty() {
            bytes(buf, 2, m.as_bytes());
        }
        key(buf, 3, VARINT);
        buf.push(2);
    }
    close(buf, status, 1);
    fixed32(buf, 16, FLAGS);
}

fn event(buf: &mut Vec<u8>, e: &SpanEvent) {
    let at = open(buf, 11, 1);
    fixed64(buf, 1, nanos(e.at));
    bytes(buf, 2, e.name.as_bytes());
    attrs(buf, 3, &e.attrs);
    close(buf, at, 1);
}

fn link(buf: &mut Vec<u8>, trace: TraceId, l: &Link) {
    let at = open(buf, 13, 1);
    bytes(buf, 1, &trace.0);
    bytes(buf, 2, &l.span.0);
    attrs(buf, 4, &l.attrs);
    fixed32(buf, 6, FLAGS);
    close(buf, at, 1);
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
        // A span's body is mostly between 128 bytes and 16 KiB: two bytes for its length.
        let at = open(&mut self.bytes, 2, 2);
        span(&mut self.bytes, s);
        close(&mut self.bytes, at, 2);
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
            let kv = open(&mut r, 1, 1);
            bytes(&mut r, 1, k.as_bytes());
            let value = open(&mut r, 2, 1);
            any(&mut r, v);
            close(&mut r, value, 1);
            close(&mut r, kv, 1);
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
