//! What the text before the solution starts is: blanks, prose, or a JSON value that is not an
//! object (an array of calls, a string, a number...).
//!
//! Part of the plan parser: while it looks for the solution's opening brace, it hands every
//! byte to [`Lead`] too. When the text's first significant byte (after blanks and one opening
//! code-fence line) could start a JSON value other than an object, a side [`Scanner`] checks
//! the JSON grammar from there; once that value is complete, only blanks or a closing fence
//! may follow. So `[{"_tool": ...}]` is recognised as an array the moment its object starts,
//! and `"text"` or `42` at the end of the stream, while `1. First...`, `[see below] {...}` and
//! `true story` stay prose. Deliberately not here: finding the solution (the parser's prefix
//! rule) or remembering any byte.

use super::scan::{Scanner, Sig};

/// See the module docs.
#[derive(Debug)]
pub(super) enum Lead {
    /// Only blanks so far.
    Blank,
    /// Inside the first line, which opens a code fence (from its first backtick).
    Fence,
    /// The text is prose (or a JSON value followed by prose): nothing more to learn.
    Prose,
    /// A JSON value started at `at`; `found` says what it is.
    Value {
        scan: Scanner,
        at: usize,
        found: &'static str,
        /// The value is complete and a closing fence followed: the rest is not looked at.
        fenced: bool,
    },
}

impl Lead {
    /// Takes the next byte of the text, at stream offset `offset`.
    pub(super) fn push(&mut self, b: u8, offset: usize, max_depth: usize) {
        let blank = matches!(b, b' ' | b'\t' | b'\n' | b'\r');
        match self {
            Lead::Blank if blank => {}
            Lead::Blank if b == b'`' => *self = Lead::Fence,
            Lead::Blank => *self = Lead::start(b, offset, max_depth),
            Lead::Fence => {
                if b == b'\n' {
                    *self = Lead::Blank;
                }
            }
            Lead::Prose => {}
            Lead::Value { fenced: true, .. } => {}
            Lead::Value { scan, fenced, .. } => {
                if scan.is_done() {
                    match b {
                        _ if blank => {}
                        b'`' => *fenced = true,
                        _ => *self = Lead::Prose,
                    }
                    return;
                }
                match scan.push(b) {
                    Err(_) => *self = Lead::Prose,
                    // A number ended before this byte, which comes after the value.
                    Ok(Sig::EndBefore(_)) => self.push(b, offset, max_depth),
                    Ok(_) => {}
                }
            }
        }
    }

    fn start(b: u8, at: usize, max_depth: usize) -> Lead {
        let found = match b {
            b'[' => "an array",
            b'"' => "a string",
            b'-' | b'0'..=b'9' => "a number",
            b't' | b'f' => "a boolean",
            b'n' => "null",
            _ => return Lead::Prose,
        };
        let mut scan = Scanner::new(max_depth);
        match scan.push(b) {
            Ok(_) => Lead::Value {
                scan,
                at,
                found,
                fenced: false,
            },
            Err(_) => Lead::Prose,
        }
    }

    /// When the text so far is an unfinished JSON array: where it starts. An object opening
    /// now is one of its elements, not the solution.
    pub(super) fn open_array(&self) -> Option<usize> {
        match self {
            Lead::Value {
                scan, at, found, ..
            } if *found == "an array" && !scan.is_done() => Some(*at),
            _ => None,
        }
    }

    /// At the end of a text without a solution: the JSON value it is (or starts to be), and
    /// where that value starts.
    pub(super) fn value(&self) -> Option<(&'static str, usize)> {
        match self {
            Lead::Value { at, found, .. } => Some((found, *at)),
            _ => None,
        }
    }
}
