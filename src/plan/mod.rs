//! The plan parser: reads the model's Solution while it streams and hands out each call the
//! moment its closing brace arrives.
//!
//! [`SolutionParser`] is sans-IO: feed it chunks of text as they come (split anywhere, even inside
//! a string, an escape or a multi-byte UTF-8 character) and it returns [`ParseEvent`]s. It scans
//! each byte once and keeps only the bytes of the key or value it is currently capturing (one
//! call, the `output`, ...), so the cost is linear in the text however it is chunked. The whole
//! JSON grammar is checked byte by byte, so a malformed or truncated text gives a typed
//! [`ParseError`] with the byte offset into the whole stream, after the calls already emitted.
//!
//! The rules it follows are numbered in `spec/parser.md`.
//!
//! Deliberately not here: deciding what to do with a call (the scheduler does), validating params
//! against tool schemas (`schema`), repairing malformed JSON, or reading from any stream.

mod capture;
mod error;
mod lead;
mod scan;
#[cfg(test)]
mod tests;

pub use error::{ParseError, ParseErrorKind};

use serde_json::Value;

use crate::protocol::{Call, ProtocolError, Solution};
use capture::{Capture, Parts, Target};
use lead::Lead;
use scan::{Scanner, Sig};

/// Something the parser learned from the text.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ParseEvent {
    /// An element of `calls` is complete. Emitted as soon as its last byte arrives.
    Call {
        /// Position in the `calls` array (0-based, counting invalid elements too).
        index: usize,
        /// The call, or why the element is not a valid call (the parser goes on either way).
        call: Result<Call, ProtocolError>,
        /// The element exactly as the model wrote it.
        raw: Value,
    },
    /// The `output` value is complete (emitted for `null` too).
    Output(Value),
    /// A top-level member whose key a Solution does not have (`calls`, `output`, `thoughts`,
    /// `meta`) is complete. It is kept in the Solution's `extra` too; reporting it is the
    /// caller's choice (the engine tells the model: the composed schema allows no such member).
    UnknownField {
        /// The key.
        key: String,
        /// Its value.
        value: Value,
    },
    /// The solution object is closed. Its `calls` are the elements that were valid calls.
    Solution(Solution),
}

/// Bounds that keep hostile or runaway text from costing unbounded memory or stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most objects/arrays nested inside one another, the solution object included.
    pub max_depth: usize,
    /// Largest top-level key, in bytes (quotes included).
    pub max_key_bytes: usize,
    /// Largest single value kept in memory (one call, `output`, `thoughts`, ...), in bytes.
    pub max_value_bytes: usize,
    /// Most bytes read up to the end of the solution object, prose before it included.
    pub max_total_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_depth: 128,
            max_key_bytes: 1024,
            max_value_bytes: 16 << 20,
            max_total_bytes: 64 << 20,
        }
    }
}

#[derive(Debug)]
enum Phase {
    /// Skipping prose or a fence; `Some(offset)` of a `{` that may open the solution.
    Prefix(Option<usize>),
    Object,
    Done,
    Failed(ParseError),
}

/// An incremental parser for one Solution (see the module docs).
///
/// ```
/// use dagloop::plan::{ParseEvent, SolutionParser};
/// let mut parser = SolutionParser::new();
/// let mut events = parser.feed("```json\n{\"calls\": [{\"_tool\": \"a\"}, {\"_to");
/// assert!(matches!(&events[0], ParseEvent::Call { index: 0, call: Ok(_), .. }));
/// events.extend(parser.feed("ol\": \"b\"}], \"output\": null}\n```"));
/// events.extend(parser.finish().unwrap());
/// assert_eq!(events.len(), 3 + 1); // two calls, the output, the solution
/// ```
#[derive(Debug)]
pub struct SolutionParser {
    limits: Limits,
    phase: Phase,
    scan: Scanner,
    /// Stream offset of the first byte of the chunk being scanned (after a chunk: bytes seen).
    base: usize,
    capture: Option<Capture>,
    /// The top-level key whose value is being read.
    key: Option<String>,
    /// Inside the `calls` array (its elements are at depth 2).
    in_calls: bool,
    next_index: usize,
    parts: Parts,
    /// Whether the final [`ParseEvent::Solution`] repeats every call (see [`Self::streaming`]).
    keep_calls: bool,
    /// What the text before the solution is (prose, or a JSON value that is not an object).
    lead: Lead,
}

impl Default for SolutionParser {
    fn default() -> Self {
        Self::new()
    }
}

impl SolutionParser {
    /// A parser with the default [`Limits`].
    pub fn new() -> Self {
        Self::with_limits(Limits::default())
    }

    /// A parser with the given limits (each at least 1).
    pub fn with_limits(limits: Limits) -> Self {
        let limits = Limits {
            max_depth: limits.max_depth.max(1),
            max_key_bytes: limits.max_key_bytes.max(1),
            max_value_bytes: limits.max_value_bytes.max(1),
            max_total_bytes: limits.max_total_bytes.max(1),
        };
        SolutionParser {
            limits,
            phase: Phase::Prefix(None),
            scan: Scanner::new(limits.max_depth),
            base: 0,
            capture: None,
            key: None,
            in_calls: false,
            next_index: 0,
            parts: Parts::default(),
            keep_calls: true,
            lead: Lead::Blank,
        }
    }

    /// For a caller that takes each call from its [`ParseEvent::Call`] as it streams (the
    /// engine): a valid call's `raw` is `null` (the call holds all of it; an invalid one keeps
    /// its raw value) and the final [`ParseEvent::Solution`] has empty `calls`, so no call is
    /// copied or held twice. Everything else is the same.
    pub fn streaming(mut self) -> Self {
        self.keep_calls = false;
        self
    }

    /// Feeds the next piece of text. See [`feed_bytes`](Self::feed_bytes).
    pub fn feed(&mut self, chunk: &str) -> Vec<ParseEvent> {
        self.feed_bytes(chunk.as_bytes())
    }

    /// Feeds the next bytes of UTF-8 text, which may end in the middle of a character.
    ///
    /// Returns the events completed by these bytes. After an error (see [`error`](Self::error))
    /// or once the solution is complete, further input is ignored.
    pub fn feed_bytes(&mut self, chunk: &[u8]) -> Vec<ParseEvent> {
        let mut out = Vec::new();
        if let Err(e) = self.scan_chunk(chunk, &mut out) {
            self.capture = None;
            self.phase = Phase::Failed(e);
        }
        self.base += chunk.len();
        out
    }

    /// The error that stopped the parser, if any. The caller may stop reading the stream.
    pub fn error(&self) -> Option<&ParseError> {
        match &self.phase {
            Phase::Failed(e) => Some(e),
            _ => None,
        }
    }

    /// True once the solution object has closed and [`ParseEvent::Solution`] was emitted.
    pub fn is_complete(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// Bytes fed so far.
    pub fn bytes_seen(&self) -> usize {
        self.base
    }

    /// Ends the stream: `Ok` with any last events when the solution was complete, otherwise the
    /// error (a truncation error if the text stopped inside the solution).
    pub fn finish(self) -> Result<Vec<ParseEvent>, ParseError> {
        let call_index = self.current_call();
        match self.phase {
            Phase::Done => Ok(Vec::new()),
            Phase::Failed(e) => Err(e),
            Phase::Prefix(_) => Err(match self.lead.value() {
                Some((found, at)) => ParseError {
                    offset: at,
                    kind: ParseErrorKind::NotAnObject { found },
                    call_index: None,
                },
                None => ParseError {
                    offset: self.base,
                    kind: ParseErrorKind::NoSolution,
                    call_index: None,
                },
            }),
            Phase::Object => Err(ParseError {
                offset: self.base,
                kind: ParseErrorKind::Truncated {
                    expected: self.scan.expected(),
                },
                call_index,
            }),
        }
    }

    /// The `calls` element being read (or awaited) while inside the `calls` array.
    fn current_call(&self) -> Option<usize> {
        self.in_calls.then_some(self.next_index)
    }

    fn error_at(&self, offset: usize, kind: ParseErrorKind) -> ParseError {
        ParseError {
            offset,
            kind,
            call_index: self.current_call(),
        }
    }

    fn scan_chunk(&mut self, chunk: &[u8], out: &mut Vec<ParseEvent>) -> Result<(), ParseError> {
        let mut i = 0;
        while i < chunk.len() {
            match self.phase {
                Phase::Done | Phase::Failed(_) => return Ok(()),
                Phase::Prefix(candidate) => i = self.skip_prefix(chunk, i, candidate)?,
                Phase::Object => i = self.scan_object(chunk, i, out)?,
            }
        }
        if let Some(c) = &mut self.capture {
            c.buf.extend_from_slice(&chunk[c.from..]);
            c.from = 0;
        }
        Ok(())
    }

    /// Looks for a `{` whose next non-blank byte is `"` or `}`: the start of the solution.
    fn skip_prefix(
        &mut self,
        chunk: &[u8],
        mut i: usize,
        mut candidate: Option<usize>,
    ) -> Result<usize, ParseError> {
        let end = chunk
            .len()
            .min(self.limits.max_total_bytes.saturating_sub(self.base));
        while i < end {
            let b = chunk[i];
            self.lead.push(b, self.base + i, self.limits.max_depth);
            match candidate {
                Some(at) if b == b'"' || b == b'}' => {
                    if let Some(array) = self.lead.open_array() {
                        // `[{"...`: the object is an element of an array, not the solution.
                        let kind = ParseErrorKind::NotAnObject { found: "an array" };
                        return Err(self.error_at(array, kind));
                    }
                    // Replay the brace, then scan this byte as part of the object.
                    self.scan.push(b'{').map_err(|k| self.error_at(at, k))?;
                    self.phase = Phase::Object;
                    return Ok(i);
                }
                Some(_) if matches!(b, b' ' | b'\t' | b'\n' | b'\r') => {}
                _ => candidate = (b == b'{').then_some(self.base + i),
            }
            i += 1;
        }
        if end < chunk.len() {
            return Err(self.too_large_total());
        }
        self.phase = Phase::Prefix(candidate);
        Ok(i)
    }

    fn too_large_total(&self) -> ParseError {
        let limit = self.limits.max_total_bytes;
        self.error_at(
            limit,
            ParseErrorKind::TooLarge {
                what: "solution",
                limit,
            },
        )
    }

    /// Scans the solution object until the chunk ends or the object closes.
    fn scan_object(
        &mut self,
        chunk: &[u8],
        mut i: usize,
        out: &mut Vec<ParseEvent>,
    ) -> Result<usize, ParseError> {
        while i < chunk.len() {
            let offset = self.base + i;
            let stop = self.capture.as_ref().map_or(usize::MAX, |c| c.limit_at);
            let stop = stop.min(self.limits.max_total_bytes);
            // Plain string content changes nothing but the capture: take it in bulk.
            let room = stop.saturating_sub(offset).min(chunk.len() - i);
            let run = self.scan.plain_run(&chunk[i..i + room]);
            if run > 0 {
                i += run;
                continue;
            }
            let b = chunk[i];
            let sig = self.scan.push(b).map_err(|k| self.error_at(offset, k))?;
            if offset >= stop && !matches!(sig, Sig::EndBefore(_)) {
                return Err(self.limit_error(offset));
            }
            match sig {
                Sig::None => {}
                Sig::KeyStart(1) => self.begin(Target::Key, i),
                Sig::KeyEnd(1) => self.end_key(chunk, i + 1)?,
                Sig::Start(1) => self.begin_member(i, b)?,
                Sig::Start(2) if self.in_calls => self.begin(Target::Call, i),
                Sig::End(0) => {
                    self.end_solution(out);
                    return Ok(chunk.len());
                }
                Sig::End(1) if self.in_calls => self.in_calls = false,
                Sig::End(d) if d <= 2 => self.end_value(chunk, i + 1, d, out)?,
                Sig::EndBefore(d) => {
                    if d <= 2 {
                        self.end_value(chunk, i, d, out)?;
                    }
                    continue; // the byte after the number is scanned again
                }
                _ => {}
            }
            i += 1;
        }
        Ok(i)
    }

    fn limit_error(&self, offset: usize) -> ParseError {
        match &self.capture {
            Some(c) if offset >= c.limit_at => {
                let (what, limit) = match c.target {
                    Target::Key => ("key", self.limits.max_key_bytes),
                    _ => ("value", self.limits.max_value_bytes),
                };
                self.error_at(c.limit_at, ParseErrorKind::TooLarge { what, limit })
            }
            _ => self.too_large_total(),
        }
    }
}
