//! A byte-at-a-time JSON syntax checker that tells its caller where keys and values begin and end.
//!
//! It checks the whole JSON grammar (RFC 8259), including UTF-8 inside strings and the pairing of
//! `\u` surrogate escapes, so every byte range it reports as one complete value is text that
//! serde_json accepts (numbers out of `f64` range aside). Its memory is the container stack only.
//!
//! Deliberately not here: building values, remembering bytes, offsets, or anything about
//! Solutions. The caller ([`super::SolutionParser`]) keeps the bytes it cares about.

use super::error::ParseErrorKind;

/// What a byte meant, structurally. Depths count the containers enclosing the key or value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sig {
    /// Nothing the caller needs to know.
    None,
    /// This byte is the first byte of a value at this depth.
    Start(usize),
    /// This byte is the last byte of a value at this depth.
    End(usize),
    /// The number at this depth ended just before this byte: the byte is not part of it and must
    /// be pushed again.
    EndBefore(usize),
    /// This byte opens a key (`"`) of the object whose members sit at this depth.
    KeyStart(usize),
    /// This byte closes that key.
    KeyEnd(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Container {
    Object,
    Array,
}

/// Where we are inside a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sub {
    Plain,
    /// Inside a multi-byte UTF-8 sequence: `need` more bytes, the next in `lo..=hi`.
    Utf8 {
        need: u8,
        lo: u8,
        hi: u8,
    },
    Escape,
    Hex {
        n: u8,
        acc: u16,
    },
    /// After a high surrogate: `\`, then `u`, then four hex digits of a low surrogate.
    LowSlash,
    LowU,
    LowHex {
        n: u8,
        acc: u16,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    Exp,
    ExpSign,
    ExpDigit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    /// A value is expected; `]` too when this is the first slot of an array.
    Value {
        first_in_array: bool,
    },
    /// Just after `{`: a key or `}`.
    ObjectFirst,
    /// After `,` in an object: a key.
    ObjectKey,
    Colon,
    /// After a value inside a container: `,` or the closing bracket.
    After,
    Str {
        key: bool,
        sub: Sub,
    },
    Num(Num),
    Lit {
        word: &'static [u8],
        at: u8,
    },
    /// The root value is complete.
    Done,
}

/// The JSON grammar as a pushdown automaton.
#[derive(Debug, Clone)]
pub(crate) struct Scanner {
    st: St,
    stack: Vec<Container>,
    max_depth: usize,
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn hex(b: u8) -> Option<u16> {
    (b as char).to_digit(16).map(|d| d as u16)
}

fn unexpected(found: u8, expected: &'static str) -> ParseErrorKind {
    ParseErrorKind::Unexpected { found, expected }
}

impl Scanner {
    /// A scanner expecting one root value, refusing more than `max_depth` nested containers.
    pub(crate) fn new(max_depth: usize) -> Self {
        Scanner {
            st: St::Value {
                first_in_array: false,
            },
            stack: Vec::new(),
            max_depth,
        }
    }

    /// Consumes one byte.
    pub(crate) fn push(&mut self, b: u8) -> Result<Sig, ParseErrorKind> {
        match self.st {
            St::Value { first_in_array } => {
                if is_ws(b) {
                    Ok(Sig::None)
                } else if b == b']' && first_in_array {
                    Ok(self.close())
                } else {
                    self.start_value(b, first_in_array)
                }
            }
            St::ObjectFirst | St::ObjectKey => {
                if is_ws(b) {
                    Ok(Sig::None)
                } else if b == b'"' {
                    self.st = St::Str {
                        key: true,
                        sub: Sub::Plain,
                    };
                    Ok(Sig::KeyStart(self.stack.len()))
                } else if b == b'}' && self.st == St::ObjectFirst {
                    Ok(self.close())
                } else {
                    Err(unexpected(b, self.expected()))
                }
            }
            St::Colon => match b {
                b':' => {
                    self.st = St::Value {
                        first_in_array: false,
                    };
                    Ok(Sig::None)
                }
                _ if is_ws(b) => Ok(Sig::None),
                _ => Err(unexpected(b, "`:`")),
            },
            St::After => self.after(b),
            St::Str { key, sub } => self.string(b, key, sub),
            St::Num(n) => self.number(b, n),
            St::Lit { word, at } => {
                if word.get(at as usize) != Some(&b) {
                    return Err(unexpected(b, self.expected()));
                }
                if at as usize + 1 == word.len() {
                    self.finish_value();
                    Ok(Sig::End(self.stack.len()))
                } else {
                    self.st = St::Lit { word, at: at + 1 };
                    Ok(Sig::None)
                }
            }
            St::Done => Err(unexpected(b, "the end of the text")),
        }
    }

    /// True once the root value is complete.
    pub(crate) fn is_done(&self) -> bool {
        self.st == St::Done
    }

    /// How many leading bytes of `bytes` are plain ASCII string content, which changes nothing
    /// in the scanner's state and can be taken in bulk. Zero unless inside a string.
    pub(crate) fn plain_run(&self, bytes: &[u8]) -> usize {
        if !matches!(
            self.st,
            St::Str {
                sub: Sub::Plain,
                ..
            }
        ) {
            return 0;
        }
        bytes
            .iter()
            .position(|&b| !(0x20..0x80).contains(&b) || b == b'"' || b == b'\\')
            .unwrap_or(bytes.len())
    }

    /// What the grammar needs next, for truncation errors.
    pub(crate) fn expected(&self) -> &'static str {
        match self.st {
            St::Value {
                first_in_array: true,
            } => "a value or `]`",
            St::Value {
                first_in_array: false,
            } => "a value",
            St::ObjectFirst => "a key or `}`",
            St::ObjectKey => "a key",
            St::Colon => "`:`",
            St::After => match self.stack.last() {
                Some(Container::Array) => "`,` or `]`",
                _ => "`,` or `}`",
            },
            St::Str { key: true, .. } => "the rest of a key",
            St::Str { key: false, .. } => "the rest of a string",
            St::Num(Num::Minus | Num::Dot | Num::ExpSign) => "a digit",
            St::Num(Num::Exp) => "a digit or a sign",
            St::Num(_) => "the rest of a number",
            St::Lit { word, .. } => match word {
                b"true" => "the rest of `true`",
                b"false" => "the rest of `false`",
                _ => "the rest of `null`",
            },
            St::Done => "nothing",
        }
    }

    fn start_value(&mut self, b: u8, first_in_array: bool) -> Result<Sig, ParseErrorKind> {
        let depth = self.stack.len();
        self.st = match b {
            b'{' => {
                self.open(Container::Object)?;
                St::ObjectFirst
            }
            b'[' => {
                self.open(Container::Array)?;
                St::Value {
                    first_in_array: true,
                }
            }
            b'"' => St::Str {
                key: false,
                sub: Sub::Plain,
            },
            b'-' => St::Num(Num::Minus),
            b'0' => St::Num(Num::Zero),
            b'1'..=b'9' => St::Num(Num::Int),
            b't' => St::Lit {
                word: b"true",
                at: 1,
            },
            b'f' => St::Lit {
                word: b"false",
                at: 1,
            },
            b'n' => St::Lit {
                word: b"null",
                at: 1,
            },
            _ => {
                let expected = if first_in_array {
                    "a value or `]`"
                } else {
                    "a value"
                };
                return Err(unexpected(b, expected));
            }
        };
        Ok(Sig::Start(depth))
    }

    fn open(&mut self, c: Container) -> Result<(), ParseErrorKind> {
        if self.stack.len() >= self.max_depth {
            return Err(ParseErrorKind::TooDeep {
                limit: self.max_depth,
            });
        }
        self.stack.push(c);
        Ok(())
    }

    fn close(&mut self) -> Sig {
        self.stack.pop();
        self.finish_value();
        Sig::End(self.stack.len())
    }

    fn finish_value(&mut self) {
        self.st = if self.stack.is_empty() {
            St::Done
        } else {
            St::After
        };
    }

    fn after(&mut self, b: u8) -> Result<Sig, ParseErrorKind> {
        if is_ws(b) {
            return Ok(Sig::None);
        }
        match (self.stack.last(), b) {
            (Some(Container::Object), b',') => self.st = St::ObjectKey,
            (Some(Container::Array), b',') => {
                self.st = St::Value {
                    first_in_array: false,
                }
            }
            (Some(Container::Object), b'}') | (Some(Container::Array), b']') => {
                return Ok(self.close());
            }
            _ => return Err(unexpected(b, self.expected())),
        }
        Ok(Sig::None)
    }

    fn string(&mut self, b: u8, key: bool, sub: Sub) -> Result<Sig, ParseErrorKind> {
        let next = match sub {
            Sub::Plain => match b {
                b'"' => {
                    let depth = self.stack.len();
                    return Ok(if key {
                        self.st = St::Colon;
                        Sig::KeyEnd(depth)
                    } else {
                        self.finish_value();
                        Sig::End(depth)
                    });
                }
                b'\\' => Sub::Escape,
                0x00..=0x1F => return Err(ParseErrorKind::ControlCharacter { byte: b }),
                0x20..=0x7F => Sub::Plain,
                0xC2..=0xDF => Sub::Utf8 {
                    need: 1,
                    lo: 0x80,
                    hi: 0xBF,
                },
                0xE0 => Sub::Utf8 {
                    need: 2,
                    lo: 0xA0,
                    hi: 0xBF,
                },
                0xE1..=0xEC | 0xEE..=0xEF => Sub::Utf8 {
                    need: 2,
                    lo: 0x80,
                    hi: 0xBF,
                },
                0xED => Sub::Utf8 {
                    need: 2,
                    lo: 0x80,
                    hi: 0x9F,
                },
                0xF0 => Sub::Utf8 {
                    need: 3,
                    lo: 0x90,
                    hi: 0xBF,
                },
                0xF1..=0xF3 => Sub::Utf8 {
                    need: 3,
                    lo: 0x80,
                    hi: 0xBF,
                },
                0xF4 => Sub::Utf8 {
                    need: 3,
                    lo: 0x80,
                    hi: 0x8F,
                },
                _ => return Err(ParseErrorKind::InvalidUtf8 { byte: b }),
            },
            Sub::Utf8 { need, lo, hi } => {
                if !(lo..=hi).contains(&b) {
                    return Err(ParseErrorKind::InvalidUtf8 { byte: b });
                }
                if need == 1 {
                    Sub::Plain
                } else {
                    Sub::Utf8 {
                        need: need - 1,
                        lo: 0x80,
                        hi: 0xBF,
                    }
                }
            }
            Sub::Escape => match b {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Sub::Plain,
                b'u' => Sub::Hex { n: 0, acc: 0 },
                _ => return Err(ParseErrorKind::InvalidEscape),
            },
            Sub::Hex { n, acc } => {
                let acc = (acc << 4) | hex(b).ok_or(ParseErrorKind::InvalidEscape)?;
                match (n + 1, acc) {
                    (4, 0xDC00..=0xDFFF) => return Err(ParseErrorKind::UnpairedSurrogate),
                    (4, 0xD800..=0xDBFF) => Sub::LowSlash,
                    (4, _) => Sub::Plain,
                    (n, acc) => Sub::Hex { n, acc },
                }
            }
            Sub::LowSlash if b == b'\\' => Sub::LowU,
            Sub::LowU if b == b'u' => Sub::LowHex { n: 0, acc: 0 },
            Sub::LowSlash | Sub::LowU => return Err(ParseErrorKind::UnpairedSurrogate),
            Sub::LowHex { n, acc } => {
                let acc = (acc << 4) | hex(b).ok_or(ParseErrorKind::InvalidEscape)?;
                match (n + 1, acc) {
                    (4, 0xDC00..=0xDFFF) => Sub::Plain,
                    (4, _) => return Err(ParseErrorKind::UnpairedSurrogate),
                    (n, acc) => Sub::LowHex { n, acc },
                }
            }
        };
        self.st = St::Str { key, sub: next };
        Ok(Sig::None)
    }

    fn number(&mut self, b: u8, n: Num) -> Result<Sig, ParseErrorKind> {
        let digit = b.is_ascii_digit();
        let next = match (n, b) {
            (Num::Minus, b'0') => Num::Zero,
            (Num::Minus, _) if digit => Num::Int,
            (Num::Int, _) if digit => Num::Int,
            (Num::Zero | Num::Int, b'.') => Num::Dot,
            (Num::Dot | Num::Frac, _) if digit => Num::Frac,
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Num::Exp,
            (Num::Exp, b'+' | b'-') => Num::ExpSign,
            (Num::Exp | Num::ExpSign | Num::ExpDigit, _) if digit => Num::ExpDigit,
            (Num::Zero | Num::Int | Num::Frac | Num::ExpDigit, _) => {
                self.finish_value();
                return Ok(Sig::EndBefore(self.stack.len()));
            }
            _ => return Err(unexpected(b, self.expected())),
        };
        self.st = St::Num(next);
        Ok(Sig::None)
    }
}
