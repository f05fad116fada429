//! A finished span as dagloop describes it, independent of any OpenTelemetry crate: what the
//! span builder produces, what the OTLP exporter converts and what tests read.
//!
//! Deliberately not here: building spans from a run (`spans`) or sending them (`export`).

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use super::ids::{SpanId, TraceId};
use crate::protocol::Millis;

/// An attribute value. Strings that every span repeats (names of operations, statuses, the
/// run's id, a tool's activity) are borrowed or shared, not copied per span.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum Value {
    /// A string.
    Str(Cow<'static, str>),
    /// A string shared with whatever else holds it.
    Shared(Arc<str>),
    /// An id written as its decimal digits, a string (a call's `gen_ai.tool.call.id`): kept
    /// as the number until it is encoded, so a span costs no allocation per id.
    #[serde(serialize_with = "display")]
    Id(u64),
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
    /// Several strings.
    Strs(Vec<String>),
}

impl Value {
    /// A copy of `s`.
    pub fn text(s: &str) -> Self {
        Value::Str(Cow::Owned(s.to_string()))
    }

    /// The string it holds, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            Value::Shared(s) => Some(s),
            _ => None,
        }
    }
}

impl From<&'static str> for Value {
    fn from(s: &'static str) -> Self {
        Value::Str(Cow::Borrowed(s))
    }
}
impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(Cow::Owned(s))
    }
}
impl From<Arc<str>> for Value {
    fn from(s: Arc<str>) -> Self {
        Value::Shared(s)
    }
}
impl From<u64> for Value {
    fn from(n: u64) -> Self {
        Value::Int(i64::try_from(n).unwrap_or(i64::MAX))
    }
}
impl From<u32> for Value {
    fn from(n: u32) -> Self {
        Value::Int(i64::from(n))
    }
}
impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

/// Attributes in the order they were set.
pub type Attrs = Vec<(&'static str, Value)>;

/// Attributes that many spans carry alike (the run's id, a tool's names), made once and shared
/// by every span that carries them, in front of the span's own ([`SpanRecord::shared`]). An
/// exporter that writes them the same way every time keeps what it wrote with them
/// ([`Shared::encoded`]), so a run's hundredth call span costs it a copy, not their encoding.
#[derive(Debug, Default, serde::Serialize)]
#[serde(transparent)]
pub struct Shared {
    attrs: Attrs,
    #[serde(skip)]
    encoded: OnceLock<Vec<u8>>,
}

impl Shared {
    /// A group of these attributes.
    pub fn new(attrs: Attrs) -> Self {
        Shared {
            attrs,
            encoded: OnceLock::new(),
        }
    }

    /// The attributes, in order.
    pub fn attrs(&self) -> &Attrs {
        &self.attrs
    }

    /// Their encoding, made by `encode` the first time it is asked for (one exporter's: a
    /// process has one span exporter).
    pub fn encoded(&self, encode: impl FnOnce(&Attrs) -> Vec<u8>) -> &[u8] {
        self.encoded.get_or_init(|| encode(&self.attrs))
    }
}

impl PartialEq for Shared {
    fn eq(&self, other: &Self) -> bool {
        self.attrs == other.attrs
    }
}

/// Something that happened during a span (a retry, a fallback).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SpanEvent {
    /// Its name.
    pub name: &'static str,
    /// When.
    pub at: Millis,
    /// Its attributes.
    pub attrs: Attrs,
}

/// A link to another span of the same trace.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Link {
    /// The span linked to.
    #[serde(serialize_with = "display")]
    pub span: SpanId,
    /// What the link means (`dagloop.link.type`: `waited_on`, `resumed_from`, `original`).
    pub attrs: Attrs,
}

/// The span's kind, as OpenTelemetry names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Work inside dagloop.
    Internal,
    /// A request to another service (a model provider).
    Client,
}

/// One finished span.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SpanRecord {
    /// The trace (the run's).
    #[serde(serialize_with = "display")]
    pub trace: TraceId,
    /// Its id.
    #[serde(serialize_with = "display")]
    pub id: SpanId,
    /// Its parent, when it has one.
    #[serde(serialize_with = "display_opt")]
    pub parent: Option<SpanId>,
    /// The name (`invoke_agent dagloop`, `chat gpt-4o-mini`, `execute_tool fetch`...).
    pub name: String,
    /// Its kind.
    pub kind: Kind,
    /// Start and end, in milliseconds since the Unix epoch (the journal's times).
    pub start: Millis,
    /// The end.
    pub end: Millis,
    /// Attributes it shares with other spans, which come first ([`Shared`]).
    pub shared: Option<Arc<Shared>>,
    /// Its own attributes, after the shared ones.
    pub attrs: Attrs,
    /// Events.
    pub events: Vec<SpanEvent>,
    /// Links.
    pub links: Vec<Link>,
    /// Links left out past the exporter's limit (`OTEL_SPAN_LINK_COUNT_LIMIT`).
    pub dropped_links: u32,
    /// The error that ended it, when it failed.
    pub error: Option<String>,
}

impl SpanRecord {
    /// The attribute named `key`, if set (the last one of that name).
    pub fn attr(&self, key: &str) -> Option<&Value> {
        self.all_attrs()
            .filter(|(k, _)| *k == key)
            .last()
            .map(|(_, v)| v)
    }

    /// Every attribute, the shared ones first.
    pub fn all_attrs(&self) -> impl Iterator<Item = &(&'static str, Value)> {
        let shared = self.shared.as_deref().map_or(&[][..], |s| &s.attrs[..]);
        shared.iter().chain(&self.attrs)
    }

    /// Makes the shared attributes its own, in front of the others (to change them).
    pub fn unshare(&mut self) {
        if let Some(shared) = self.shared.take() {
            let own = std::mem::take(&mut self.attrs);
            self.attrs = shared.attrs.clone();
            self.attrs.extend(own);
        }
    }
}

fn display<T: std::fmt::Display, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

fn display_opt<T: std::fmt::Display, S: serde::Serializer>(
    v: &Option<T>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.collect_str(v),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(shared: Option<Attrs>, own: Attrs) -> SpanRecord {
        SpanRecord {
            trace: TraceId([1; 16]),
            id: SpanId([2; 8]),
            parent: None,
            name: "s".into(),
            kind: Kind::Internal,
            start: 0,
            end: 0,
            shared: shared.map(|a| Arc::new(Shared::new(a))),
            attrs: own,
            events: Vec::new(),
            links: Vec::new(),
            dropped_links: 0,
            error: None,
        }
    }

    /// What an exporter outside the crate reads: the shared attributes, then the span's own; a
    /// name set in both reads as the span's own; `unshare` keeps that order.
    #[test]
    fn shared_attributes_come_first_and_the_span_s_own_win() {
        let mut s = record(
            Some(vec![("a", Value::from("shared")), ("b", Value::Int(1))]),
            vec![("c", Value::Bool(true)), ("a", Value::from("own"))],
        );
        let keys: Vec<&str> = s.all_attrs().map(|(k, _)| *k).collect();
        assert_eq!(keys, ["a", "b", "c", "a"]);
        assert_eq!(s.attr("a"), Some(&Value::from("own")));
        assert_eq!(s.attr("b"), Some(&Value::Int(1)));
        assert_eq!(s.attr("z"), None);
        let before: Attrs = s.all_attrs().cloned().collect();
        s.unshare();
        assert!(s.shared.is_none());
        assert_eq!(s.attrs, before);
        let plain = record(None, vec![("c", Value::Bool(false))]);
        assert_eq!(plain.all_attrs().count(), 1);
    }

    /// The encoding is made once, by the first caller, and kept.
    #[test]
    fn a_shared_group_keeps_its_first_encoding() {
        let g = Shared::new(vec![("a", Value::Int(1))]);
        assert_eq!(g.encoded(|a| vec![a.len() as u8]), [1]);
        assert_eq!(g.encoded(|_| vec![9, 9]), [1]);
    }
}
