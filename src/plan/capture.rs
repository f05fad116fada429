//! Keeping the bytes of the key or value being read, and turning finished ones into events.
//!
//! Part of the plan parser: [`SolutionParser`] scans; this file decides what a completed top-level
//! key, member value or `calls` element means. Deliberately not here: scanning or prefix rules.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::{ParseError, ParseErrorKind, ParseEvent, Phase, SolutionParser};
use crate::protocol::{Call, Solution, SplitCall};

/// What a capture holds: a top-level key, a top-level member's value, or an element of `calls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    Key,
    Member,
    Call,
}

/// Bytes being kept: from `start` (stream offset) up to where the current chunk is scanned.
#[derive(Debug)]
pub(super) struct Capture {
    pub(super) target: Target,
    pub(super) start: usize,
    /// The stream offset of the first byte past the limit.
    pub(super) limit_at: usize,
    /// Bytes from earlier chunks.
    pub(super) buf: Vec<u8>,
    /// Index in the current chunk where the not-yet-copied bytes begin.
    pub(super) from: usize,
}

/// The pieces of the Solution gathered so far.
#[derive(Debug, Default)]
pub(super) struct Parts {
    keys: BTreeSet<String>,
    calls: Vec<Call>,
    output: Option<Value>,
    meta: Option<Value>,
    thoughts: Option<Value>,
    extra: Map<String, Value>,
}

impl SolutionParser {
    pub(super) fn begin(&mut self, target: Target, i: usize) {
        let limit = match target {
            Target::Key => self.limits.max_key_bytes,
            _ => self.limits.max_value_bytes,
        };
        let start = self.base + i;
        self.capture = Some(Capture {
            target,
            start,
            limit_at: start.saturating_add(limit),
            buf: Vec::new(),
            from: i,
        });
    }

    /// Takes the capture, completed with the current chunk's bytes up to `end` (exclusive).
    pub(super) fn take(&mut self, chunk: &[u8], end: usize) -> Option<Capture> {
        let mut c = self.capture.take()?;
        c.buf.extend_from_slice(&chunk[c.from..end]);
        Some(c)
    }

    pub(super) fn end_key(&mut self, chunk: &[u8], end: usize) -> Result<(), ParseError> {
        let Some(c) = self.take(chunk, end) else {
            return Ok(());
        };
        let key: String = self.decode(&c)?;
        if !self.parts.keys.insert(key.clone()) {
            return Err(self.error_at(c.start, ParseErrorKind::DuplicateField { field: key }));
        }
        self.key = Some(key);
        Ok(())
    }

    pub(super) fn begin_member(&mut self, i: usize, b: u8) -> Result<(), ParseError> {
        if self.key.as_deref() == Some("calls") {
            let found = match b {
                b'[' => {
                    self.in_calls = true;
                    return Ok(());
                }
                b'n' => None, // null: captured and checked like any member
                b'{' => Some("an object"),
                b'"' => Some("a string"),
                b't' | b'f' => Some("a boolean"),
                _ => Some("a number"),
            };
            if let Some(found) = found {
                let kind = ParseErrorKind::CallsNotArray { found };
                return Err(self.error_at(self.base + i, kind));
            }
        }
        self.begin(Target::Member, i);
        Ok(())
    }

    /// A value at depth 1 (a member) or 2 (an element of `calls`) ended at `end` (exclusive).
    pub(super) fn end_value(
        &mut self,
        chunk: &[u8],
        end: usize,
        depth: usize,
        out: &mut Vec<ParseEvent>,
    ) -> Result<(), ParseError> {
        let wanted = if depth == 1 {
            Target::Member
        } else {
            Target::Call
        };
        if self.capture.as_ref().map(|c| c.target) != Some(wanted) {
            return Ok(()); // a value nested inside a member capture
        }
        let index = self.next_index;
        let Some(c) = self.take(chunk, end) else {
            return Ok(());
        };
        // Streaming: a call object is read straight into a call; only a call that is not one
        // (not an object, bad JSON, bad meta fields) takes the path through a value, which
        // gives the error and the raw value the model is shown.
        if wanted == Target::Call
            && !self.keep_calls
            && let Ok(split) = serde_json::from_slice::<SplitCall>(&c.buf)
            && let Ok(call) = split.into_call().and_then(Call::checked)
        {
            out.push(ParseEvent::Call {
                index,
                call: Ok(call),
                raw: Value::Null,
            });
            self.next_index += 1;
            return Ok(());
        }
        let value: Value = self.decode(&c)?;
        if wanted == Target::Call {
            let (call, raw) = if self.keep_calls {
                let call = Call::parse(value.clone());
                if let Ok(call) = &call {
                    self.parts.calls.push(call.clone());
                }
                (call, value)
            } else {
                // Streaming: the value moves into the call, and only a call that is not valid
                // has its raw value, decoded again from the same bytes.
                match Call::parse(value) {
                    Ok(call) => (Ok(call), Value::Null),
                    Err(e) => (Err(e), self.decode(&c)?),
                }
            };
            out.push(ParseEvent::Call { index, call, raw });
            self.next_index += 1;
            return Ok(());
        }
        match self.key.take().as_deref() {
            Some("output") => {
                out.push(ParseEvent::Output(value.clone()));
                self.parts.output = Some(value);
            }
            Some("calls") => {} // null: no calls
            Some("meta") => self.parts.meta = Some(value),
            Some("thoughts") => self.parts.thoughts = Some(value),
            Some(other) => {
                out.push(ParseEvent::UnknownField {
                    key: other.to_string(),
                    value: value.clone(),
                });
                self.parts.extra.insert(other.to_string(), value);
            }
            None => {}
        }
        Ok(())
    }

    pub(super) fn end_solution(&mut self, out: &mut Vec<ParseEvent>) {
        let parts = std::mem::take(&mut self.parts);
        out.push(ParseEvent::Solution(Solution {
            calls: parts.calls,
            output: parts.output.unwrap_or(Value::Null),
            meta: parts.meta,
            thoughts: parts.thoughts,
            extra: parts.extra,
        }));
        self.phase = Phase::Done;
    }

    /// Decodes captured bytes the scanner has already checked.
    fn decode<T: serde::de::DeserializeOwned>(&self, c: &Capture) -> Result<T, ParseError> {
        serde_json::from_slice(&c.buf).map_err(|e| {
            let offset = c.start + locate(&c.buf, e.line(), e.column());
            // serde_json's own position is relative to the capture: keep only the reason.
            let message = e.to_string();
            let reason = message
                .rsplit_once(" at line ")
                .map_or(&*message, |(r, _)| r);
            let kind = ParseErrorKind::InvalidValue {
                reason: reason.to_string(),
            };
            self.error_at(offset, kind)
        })
    }
}

/// The byte index in `buf` of the last byte serde_json had read when it reported an error at
/// (1-based `line`, byte `column` = bytes read on that line), clamped to the buffer.
pub(super) fn locate(buf: &[u8], line: usize, column: usize) -> usize {
    let line_start = if line <= 1 {
        0
    } else {
        buf.iter()
            .enumerate()
            .filter(|(_, b)| **b == b'\n')
            .nth(line - 2)
            .map_or(0, |(i, _)| i + 1)
    };
    (line_start + column.saturating_sub(1)).min(buf.len().saturating_sub(1))
}
