//! References (`†state.users[0].id`), paths and expressions (`a || b`, `a && b`).
//!
//! A reference names a value in the run's data: a *kind* (`state`, `input`, any data kind)
//! followed by a path. The path has a concrete part (keys and indices, used to index the write
//! log and to find overlapping writers) and an optional query tail (wildcards, filters, slices,
//! recursive descent) that is evaluated as JSONPath over the resolved concrete value.
//!
//! This file only parses and prints; it never looks anything up.

use std::fmt;

/// The marker that starts a reference.
pub const MARKER: char = '†';
/// The ASCII alias for [`MARKER`], for people who cannot type a dagger.
pub const ASCII_MARKER: &str = "$ref:";

/// One concrete step of a path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Segment {
    /// An object key.
    Key(String),
    /// An array index.
    Index(usize),
}

/// A concrete location: a kind followed by keys and indices (`state.users[0].id`).
///
/// Paths order lexicographically by segment, so every extension of a path sorts right after it
/// (the state index relies on this for range scans).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Path {
    segments: Vec<Segment>,
}

impl Path {
    /// The root of a data kind (`state`, `input`, ...).
    pub fn root(kind: impl Into<String>) -> Self {
        Path {
            segments: vec![Segment::Key(kind.into())],
        }
    }

    /// Builds a path from a kind and further segments.
    pub fn new(kind: impl Into<String>, rest: impl IntoIterator<Item = Segment>) -> Self {
        let mut p = Path::root(kind);
        p.segments.extend(rest);
        p
    }

    /// Builds a path from raw segments (the first must be the kind's key).
    pub fn from_segments(segments: Vec<Segment>) -> Self {
        Path { segments }
    }

    /// Parses `kind.a.b[0]` (no marker, no query tail).
    pub fn parse(text: &str) -> Result<Path, ReferenceError> {
        let r = parse_reference_body(text, 0, text)?;
        if r.query.is_some() {
            return Err(ReferenceError::new(
                text,
                0,
                "a concrete path cannot contain wildcards or filters",
            ));
        }
        Ok(r.path)
    }

    /// The data kind (first segment).
    pub fn kind(&self) -> &str {
        match self.segments.first() {
            Some(Segment::Key(k)) => k,
            _ => "",
        }
    }

    /// All segments, the kind first.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Segments after the kind.
    pub fn rest(&self) -> &[Segment] {
        self.segments.get(1..).unwrap_or(&[])
    }

    /// Number of segments including the kind.
    pub fn len(&self) -> usize {
        self.segments.len()
    }

    /// Always false: a path has at least its kind.
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// True if `self` equals `other` or is an ancestor of it.
    pub fn is_prefix_of(&self, other: &Path) -> bool {
        other.segments.starts_with(&self.segments)
    }

    /// Rule 4: two paths overlap when one is a prefix of (or equal to) the other.
    pub fn overlaps(&self, other: &Path) -> bool {
        self.is_prefix_of(other) || other.is_prefix_of(self)
    }

    /// The prefix made of the first `n` segments.
    pub fn truncated(&self, n: usize) -> Path {
        Path {
            segments: self.segments[..n.min(self.segments.len())].to_vec(),
        }
    }

    /// Appends a segment.
    pub fn child(&self, seg: Segment) -> Path {
        let mut p = self.clone();
        p.segments.push(seg);
        p
    }
}

impl std::borrow::Borrow<[Segment]> for Path {
    fn borrow(&self) -> &[Segment] {
        &self.segments
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text())
    }
}

impl Path {
    /// The path as written (`state.a.b[0]["odd key"]`): what `Display` prints, built in one
    /// buffer (events name a path for every write, so this is on the hot path).
    pub fn text(&self) -> String {
        let mut out = String::with_capacity(
            self.segments
                .iter()
                .map(|s| match s {
                    Segment::Key(k) => k.len() + 1,
                    Segment::Index(_) => 8,
                })
                .sum(),
        );
        for (i, s) in self.segments.iter().enumerate() {
            match s {
                Segment::Key(k) if i == 0 => out.push_str(k),
                Segment::Key(k) if is_plain_key(k) => {
                    out.push('.');
                    out.push_str(k);
                }
                Segment::Key(k) => {
                    out.push('[');
                    out.push_str(&serde_json::Value::String(k.clone()).to_string());
                    out.push(']');
                }
                Segment::Index(n) => {
                    out.push('[');
                    out.push_str(&n.to_string());
                    out.push(']');
                }
            }
        }
        out
    }
}

fn is_plain_key(k: &str) -> bool {
    !k.is_empty() && k.chars().all(is_key_char)
}

fn is_key_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '-' || c == '$'
}

fn is_kind_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

/// A reference: a concrete path and an optional JSONPath tail (`[*].price`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    /// The concrete part: what the write log is indexed by.
    pub path: Path,
    /// A JSONPath tail starting with `$` (e.g. `$[*].price`), applied to the concrete value.
    pub query: Option<String>,
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{MARKER}{}", self.path)?;
        if let Some(q) = &self.query {
            write!(f, "{}", &q[1..])?;
        }
        Ok(())
    }
}

/// How the alternatives of an expression combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Combinator {
    /// A single reference.
    Single,
    /// `a || b`: first that resolves (inputs); branch (output paths).
    Or,
    /// `a && b`: all required, value of the last (inputs); fan-out (output paths).
    And,
}

/// One or more references joined by a single combinator.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Expression {
    /// How the references combine.
    pub op: Combinator,
    /// The references, in written order (never empty).
    pub refs: Vec<Reference>,
}

impl fmt::Display for Expression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sep = match self.op {
            Combinator::And => " && ",
            _ => " || ",
        };
        for (i, r) in self.refs.iter().enumerate() {
            if i > 0 {
                f.write_str(sep)?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

/// A reference or expression that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid reference `{text}` at character {position}: {reason}")]
pub struct ReferenceError {
    /// The whole text that was being parsed.
    pub text: String,
    /// Character offset (not byte) of the problem in `text`.
    pub position: usize,
    /// What was wrong.
    pub reason: String,
}

impl ReferenceError {
    fn new(text: &str, byte_pos: usize, reason: impl Into<String>) -> Self {
        let position = text
            .char_indices()
            .take_while(|(b, _)| *b < byte_pos)
            .count();
        ReferenceError {
            text: text.to_string(),
            position,
            reason: reason.into(),
        }
    }
}

/// True if the string is meant as a reference or expression (starts with a marker after
/// optional leading whitespace). Such a string must then parse; otherwise it is plain text.
pub fn looks_like_reference(s: &str) -> bool {
    let t = s.trim_start();
    t.starts_with(MARKER) || t.starts_with(ASCII_MARKER)
}

/// Parses a whole-string expression such as `†state.a || $ref:input.b`.
///
/// Returns `Ok(None)` for a string that is not a reference at all (no leading marker).
pub fn parse_expression(text: &str) -> Result<Option<Expression>, ReferenceError> {
    if !looks_like_reference(text) {
        return Ok(None);
    }
    let mut refs = Vec::new();
    let mut op = Combinator::Single;
    let mut pos = 0;
    loop {
        pos = skip_ws(text, pos);
        let body_start = if text[pos..].starts_with(MARKER) {
            pos + MARKER.len_utf8()
        } else if text[pos..].starts_with(ASCII_MARKER) {
            pos + ASCII_MARKER.len()
        } else {
            return Err(ReferenceError::new(
                text,
                pos,
                format!("expected `{MARKER}` or `{ASCII_MARKER}`"),
            ));
        };
        let end = find_operator(text, body_start).unwrap_or(text.len());
        let body = text[body_start..end].trim_end();
        refs.push(parse_reference_body(body, body_start, text)?);
        if end == text.len() {
            break;
        }
        let this_op = if text[end..].starts_with("||") {
            Combinator::Or
        } else {
            Combinator::And
        };
        if op != Combinator::Single && op != this_op {
            return Err(ReferenceError::new(
                text,
                end,
                "cannot mix `||` and `&&` in one expression",
            ));
        }
        op = this_op;
        pos = end + 2;
        if skip_ws(text, pos) == text.len() {
            return Err(ReferenceError::new(
                text,
                text.len(),
                "expected a reference after the operator",
            ));
        }
    }
    Ok(Some(Expression { op, refs }))
}

fn skip_ws(text: &str, mut pos: usize) -> usize {
    while let Some(c) = text[pos..].chars().next() {
        if !c.is_whitespace() {
            break;
        }
        pos += c.len_utf8();
    }
    pos
}

/// Finds the next top-level `||` or `&&` (outside brackets and quotes).
fn find_operator(text: &str, from: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut quote: Option<u8> = None;
    let mut i = from;
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            Some(q) => {
                if b == b'\\' {
                    i += 1;
                } else if b == q {
                    quote = None;
                }
            }
            None => match b {
                b'\'' | b'"' => quote = Some(b),
                b'[' | b'(' => depth += 1,
                b']' | b')' => depth = depth.saturating_sub(1),
                b'|' | b'&' if depth == 0 && bytes.get(i + 1) == Some(&b) => return Some(i),
                _ => {}
            },
        }
        i += 1;
    }
    None
}

/// Parses `kind.path...` starting at byte `offset` of `whole` (for error positions).
fn parse_reference_body(
    body: &str,
    offset: usize,
    whole: &str,
) -> Result<Reference, ReferenceError> {
    let err = |at: usize, reason: &str| ReferenceError::new(whole, offset + at, reason);
    let mut chars = body.char_indices().peekable();
    let kind_end = match chars.peek() {
        Some((_, c)) if is_kind_start(*c) => {
            let mut end = body.len();
            for (i, c) in body.char_indices() {
                if !(c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                    end = i;
                    break;
                }
            }
            end
        }
        Some(_) => {
            return Err(err(
                0,
                "a reference starts with a kind such as `state` or `input`",
            ));
        }
        None => return Err(err(0, "empty reference")),
    };
    let mut path = Path::root(&body[..kind_end]);
    let mut i = kind_end;
    let bytes = body.as_bytes();
    while i < body.len() {
        match bytes[i] {
            b'.' => {
                if bytes.get(i + 1) == Some(&b'.') || bytes.get(i + 1) == Some(&b'*') {
                    return query_tail(path, &body[i..]).map_err(|r| err(i, &r));
                }
                let start = i + 1;
                let end = body[start..]
                    .char_indices()
                    .find(|(_, c)| !is_key_char(*c))
                    .map_or(body.len(), |(j, _)| start + j);
                if end == start {
                    return Err(err(start, "expected a key after `.`"));
                }
                path.segments
                    .push(Segment::Key(body[start..end].to_string()));
                i = end;
            }
            b'[' => {
                let close = match find_closing_bracket(body, i) {
                    Some(c) => c,
                    None => return Err(err(i, "unclosed `[`")),
                };
                let inner = body[i + 1..close].trim();
                if let Ok(n) = inner.parse::<usize>() {
                    path.segments.push(Segment::Index(n));
                } else if let Some(key) = quoted_key(inner) {
                    path.segments.push(Segment::Key(key));
                } else if inner.is_empty() {
                    return Err(err(i, "empty brackets"));
                } else if (inner.starts_with('-') && inner[1..].parse::<usize>().is_ok())
                    || inner == "*"
                    || inner.starts_with('?')
                    || inner.contains(':')
                    || inner.contains(',')
                {
                    return query_tail(path, &body[i..]).map_err(|r| err(i, &r));
                } else {
                    return Err(err(
                        i + 1,
                        "expected an index, a quoted key, `*`, a slice or a `?` filter",
                    ));
                }
                i = close + 1;
            }
            _ => return Err(err(i, "expected `.` or `[`")),
        }
    }
    Ok(Reference { path, query: None })
}

/// Checks the JSONPath tail with jsonpath-rust's parser so bad queries fail at parse time.
fn query_tail(path: Path, tail: &str) -> Result<Reference, String> {
    let query = format!("${tail}");
    match jsonpath_rust::parser::parse_json_path(&query) {
        Ok(_) => Ok(Reference {
            path,
            query: Some(query),
        }),
        Err(e) => Err(format!(
            "invalid JSONPath `{tail}`: {}",
            e.to_string().lines().next().unwrap_or("parse error")
        )),
    }
}

fn find_closing_bracket(body: &str, open: usize) -> Option<usize> {
    let bytes = body.as_bytes();
    let mut depth = 0usize;
    let mut quote: Option<u8> = None;
    let mut i = open;
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            Some(q) => {
                if b == b'\\' {
                    i += 1;
                } else if b == q {
                    quote = None;
                }
            }
            None => match b {
                b'\'' | b'"' => quote = Some(b),
                b'[' => depth += 1,
                b']' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(i);
                    }
                }
                _ => {}
            },
        }
        i += 1;
    }
    None
}

fn quoted_key(inner: &str) -> Option<String> {
    let q = inner.chars().next()?;
    if (q != '"' && q != '\'') || inner.len() < 2 || !inner.ends_with(q) {
        return None;
    }
    if q == '"' {
        serde_json::from_str::<String>(inner).ok()
    } else {
        let body = &inner[1..inner.len() - 1];
        if body.contains('\'') && !body.contains("\\'") {
            return None;
        }
        Some(body.replace("\\'", "'"))
    }
}

impl serde::Serialize for Path {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Path {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Path::parse(&s).map_err(serde::de::Error::custom)
    }
}
