//! What can go wrong while reading a streamed Solution, with stable codes and byte offsets.

/// Why the solution text could not be read.
///
/// Every variant is fatal for the stream: the parser stops at the first one. A call that is valid
/// JSON but not a valid [`Call`](crate::protocol::Call) is *not* a parse error; it is reported in
/// its [`ParseEvent::Call`](super::ParseEvent::Call) and parsing goes on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseErrorKind {
    /// The text ended before any JSON object started (prose only, or nothing at all).
    #[error("no JSON object found in the text")]
    NoSolution,
    /// The text is a JSON value other than an object (an array, a string, a number...): at
    /// its end, or, for an array, as soon as an object inside it starts.
    #[error("the Solution must be a JSON object, found {found}")]
    NotAnObject {
        /// What the text is: `an array`, `a string`, `a number`, `a boolean` or `null`.
        found: &'static str,
    },
    /// A byte that the JSON grammar does not allow at this point.
    #[error("unexpected {} where {expected} was expected", show_byte(.found))]
    Unexpected {
        /// The offending byte.
        found: u8,
        /// What the grammar allowed instead.
        expected: &'static str,
    },
    /// The text ended inside the solution object.
    #[error("the text ended where {expected} was expected")]
    Truncated {
        /// What the grammar still needed.
        expected: &'static str,
    },
    /// A raw control character (below 0x20) inside a string; JSON requires it to be escaped.
    #[error("unescaped control character {} inside a string", show_byte(.byte))]
    ControlCharacter {
        /// The control character.
        byte: u8,
    },
    /// A backslash followed by something other than `" \ / b f n r t u`, or a bad `\u` digit.
    #[error("invalid escape sequence in a string")]
    InvalidEscape,
    /// A `\u` escape encoding half of a UTF-16 surrogate pair without its other half.
    #[error("unpaired UTF-16 surrogate in a \\u escape")]
    UnpairedSurrogate,
    /// A byte that cannot appear at this point of a UTF-8 sequence inside a string.
    #[error("invalid UTF-8 ({}) inside a string", show_byte(.byte))]
    InvalidUtf8 {
        /// The offending byte.
        byte: u8,
    },
    /// Objects and arrays nested deeper than the configured limit.
    #[error("nesting deeper than {limit} levels")]
    TooDeep {
        /// The limit in force.
        limit: usize,
    },
    /// A key, a value or the whole solution is larger than the configured limit.
    #[error("{what} larger than {limit} bytes")]
    TooLarge {
        /// `key`, `value` or `solution`.
        what: &'static str,
        /// The limit in force, in bytes.
        limit: usize,
    },
    /// `calls` holds something other than an array or null.
    #[error("`calls` must be an array or null, found {found}")]
    CallsNotArray {
        /// The JSON type found instead.
        found: &'static str,
    },
    /// A top-level field of the solution appears twice.
    #[error("the field `{field}` appears twice in the solution")]
    DuplicateField {
        /// The repeated field.
        field: String,
    },
    /// Syntactically valid JSON that serde_json still refuses (a number out of `f64` range, or
    /// nesting beyond serde_json's own limit when the configured depth limit is above 128).
    #[error("invalid value: {reason}")]
    InvalidValue {
        /// serde_json's explanation.
        reason: String,
    },
}

crate::codes::has_code!(ParseErrorKind);

impl ParseErrorKind {
    /// A stable code for programs that react to failures.
    pub fn code(&self) -> &'static str {
        match self {
            ParseErrorKind::NoSolution => "plan.no_solution",
            ParseErrorKind::NotAnObject { .. } => "plan.not_an_object",
            ParseErrorKind::Unexpected { .. } => "plan.unexpected",
            ParseErrorKind::Truncated { .. } => "plan.truncated",
            ParseErrorKind::ControlCharacter { .. } => "plan.control_character",
            ParseErrorKind::InvalidEscape => "plan.invalid_escape",
            ParseErrorKind::UnpairedSurrogate => "plan.unpaired_surrogate",
            ParseErrorKind::InvalidUtf8 { .. } => "plan.invalid_utf8",
            ParseErrorKind::TooDeep { .. } => "plan.too_deep",
            ParseErrorKind::TooLarge { .. } => "plan.too_large",
            ParseErrorKind::CallsNotArray { .. } => "plan.calls_not_array",
            ParseErrorKind::DuplicateField { .. } => "plan.duplicate_field",
            ParseErrorKind::InvalidValue { .. } => "plan.invalid_value",
        }
    }
}

/// A fatal error in the solution text, located by byte offset into the whole stream.
///
/// The offset counts every byte fed so far, including any prose or fence before the JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// Byte offset into the whole stream of the byte where the problem was found (for truncation:
    /// the stream's length).
    pub offset: usize,
    /// What went wrong.
    pub kind: ParseErrorKind,
    /// The index in `calls` of the element being read when the error occurred, if any.
    pub call_index: Option<usize>,
}

crate::codes::has_code!(ParseError);

impl ParseError {
    /// A stable code for programs that react to failures (the kind's code).
    pub fn code(&self) -> &'static str {
        self.kind.code()
    }
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed solution at byte {}", self.offset)?;
        if let Some(i) = self.call_index {
            write!(f, " (in calls[{i}])")?;
        }
        write!(f, ": {}", self.kind)
    }
}

impl std::error::Error for ParseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.kind)
    }
}

/// Shows a byte in an error message: printable ASCII as itself, anything else in hex.
fn show_byte(b: &u8) -> String {
    if b.is_ascii_graphic() || *b == b' ' {
        format!("`{}`", *b as char)
    } else {
        format!("byte 0x{b:02X}")
    }
}
