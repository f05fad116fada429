//! The scripted-model file (DESIGN.md section 4): an ordered list of turns, each a Solution to
//! stream, raw text, or an error. Loading with typed errors, and rendering a turn into the chunks
//! a scripted model or the mock server sends.
//!
//! It does not check that a scripted Solution is valid (tests script bad ones on purpose) and
//! does no IO besides reading the file.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::LlmError;
use super::wire::FINAL_OUTPUT_TOOL;

/// Default chunk size, in characters.
pub const DEFAULT_CHUNK_CHARS: usize = 16;

/// A scripted model's turns, consumed one per request.
#[derive(Debug, Clone, PartialEq)]
pub struct Script {
    /// The turns in order.
    pub turns: Vec<Turn>,
}

/// One scripted answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    /// What the turn answers.
    pub body: TurnBody,
    /// Characters per streamed chunk (never splits a character).
    pub chunk_chars: usize,
    /// Pause between chunks.
    pub chunk_delay: Duration,
    /// Token usage to report instead of the estimate (characters / 4), per figure.
    pub usage: TurnUsage,
}

/// The token figures a turn reports when its file gives them (`"usage"`); a figure left out is
/// estimated from the characters sent or received.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnUsage {
    /// Tokens of the request.
    pub input_tokens: Option<u64>,
    /// Tokens of the answer.
    pub output_tokens: Option<u64>,
}

impl TurnUsage {
    /// The figures to report for a turn that sent `input_chars` and received `output_chars`.
    pub(crate) fn or_estimate(&self, input_chars: usize, output_chars: usize) -> (u64, u64) {
        (
            self.input_tokens
                .unwrap_or_else(|| estimate_tokens(input_chars)),
            self.output_tokens
                .unwrap_or_else(|| estimate_tokens(output_chars)),
        )
    }
}

/// What a turn answers.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TurnBody {
    /// A Solution object, streamed as its compact JSON text.
    Solution(Value),
    /// Raw text, possibly malformed.
    Text(String),
    /// An error answer.
    Error {
        /// HTTP status (400-599).
        status: u16,
        /// `Retry-After` in seconds.
        retry_after_s: Option<u64>,
        /// The error message.
        message: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScript {
    turns: Vec<Value>,
    #[serde(default, rename = "$schema")]
    _schema: Option<Value>,
    #[serde(default, rename = "description")]
    _description: Option<Value>,
    /// Reviewer decisions for a self-contained scripted example (read by the command line, as
    /// with `--decisions`).
    #[serde(default, rename = "decisions")]
    _decisions: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTurn {
    solution: Option<Value>,
    text: Option<String>,
    error: Option<RawError>,
    chunk_chars: Option<usize>,
    chunk_delay_ms: Option<u64>,
    #[serde(default)]
    usage: TurnUsage,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawError {
    status: u16,
    retry_after_s: Option<u64>,
    message: Option<String>,
}

impl Script {
    /// Reads and validates a script file.
    pub fn load(path: &Path) -> Result<Script, LlmError> {
        let text = std::fs::read_to_string(path).map_err(|e| LlmError::ScriptIo {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Script::parse(&text, &path.display().to_string())
    }

    /// Parses a script from JSON text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Script, LlmError> {
        let invalid = |reason: String| LlmError::ScriptInvalid {
            path: origin.to_string(),
            reason,
        };
        let raw: RawScript = serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let turns = raw
            .turns
            .into_iter()
            .enumerate()
            .map(|(i, v)| turn_of(v).map_err(|r| invalid(format!("turn {i}: {r}"))))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Script { turns })
    }
}

fn turn_of(v: Value) -> Result<Turn, String> {
    let raw: RawTurn = serde_json::from_value(v).map_err(|e| e.to_string())?;
    let chunk_chars = raw.chunk_chars.unwrap_or(DEFAULT_CHUNK_CHARS);
    if chunk_chars == 0 {
        return Err("chunk_chars must be at least 1".into());
    }
    let body = match (raw.solution, raw.text, raw.error) {
        (Some(Value::Object(s)), None, None) => TurnBody::Solution(Value::Object(s)),
        (Some(_), None, None) => return Err("`solution` must be a JSON object".into()),
        (None, Some(t), None) => TurnBody::Text(t),
        (None, None, Some(e)) => {
            if !(400..=599).contains(&e.status) {
                return Err(format!("error status {} is not in 400-599", e.status));
            }
            TurnBody::Error {
                status: e.status,
                retry_after_s: e.retry_after_s,
                message: e
                    .message
                    .unwrap_or_else(|| format!("scripted error {}", e.status)),
            }
        }
        _ => return Err("a turn needs exactly one of `solution`, `text` or `error`".into()),
    };
    Ok(Turn {
        body,
        chunk_chars,
        chunk_delay: Duration::from_millis(raw.chunk_delay_ms.unwrap_or(0)),
        usage: raw.usage,
    })
}

/// A turn as the pieces a server or scripted model sends.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Rendered {
    /// Content text in chunks.
    Text(Vec<String>),
    /// Native tool calls, each with its arguments in chunks.
    ToolCalls(Vec<RenderedCall>),
    /// An error answer.
    Error {
        status: u16,
        retry_after_s: Option<u64>,
        message: String,
    },
}

/// One native tool call of a rendered turn.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RenderedCall {
    pub id: String,
    pub name: String,
    pub argument_chunks: Vec<String>,
}

impl Turn {
    /// Renders the turn. In tool mode a Solution becomes one tool call per call (arguments: the
    /// call without `_tool`) plus a `final_output` call when `output` is not null; text stays text.
    pub(crate) fn render(&self, tool_mode: bool, turn_no: usize) -> Rendered {
        match &self.body {
            TurnBody::Error {
                status,
                retry_after_s,
                message,
            } => Rendered::Error {
                status: *status,
                retry_after_s: *retry_after_s,
                message: message.clone(),
            },
            TurnBody::Text(t) => Rendered::Text(chunk_chars(t, self.chunk_chars)),
            TurnBody::Solution(s) if tool_mode => {
                let mut calls = Vec::new();
                let items = s.get("calls").and_then(Value::as_array);
                for c in items.into_iter().flatten() {
                    let mut args = c.as_object().cloned().unwrap_or_default();
                    let name = match args.remove("_tool") {
                        Some(Value::String(n)) => n,
                        _ => String::new(),
                    };
                    calls.push((name, Value::Object(args)));
                }
                if let Some(out) = s.get("output").filter(|o| !o.is_null()) {
                    let mut args = Map::new();
                    args.insert("output".into(), out.clone());
                    calls.push((FINAL_OUTPUT_TOOL.to_string(), Value::Object(args)));
                }
                Rendered::ToolCalls(
                    calls
                        .into_iter()
                        .enumerate()
                        .map(|(i, (name, args))| RenderedCall {
                            id: format!("call_{turn_no}_{i}"),
                            name,
                            argument_chunks: chunk_chars(&args.to_string(), self.chunk_chars),
                        })
                        .collect(),
                )
            }
            TurnBody::Solution(s) => Rendered::Text(chunk_chars(&s.to_string(), self.chunk_chars)),
        }
    }
}

/// Splits text into pieces of at most `n` characters (at least 1), never inside a character.
pub(crate) fn chunk_chars(text: &str, n: usize) -> Vec<String> {
    let n = n.max(1);
    if text.is_empty() {
        return Vec::new();
    }
    // A text of at most `n` bytes has at most `n` characters: one piece, nothing to count.
    if text.len() <= n {
        return vec![text.to_string()];
    }
    let mut out = Vec::new();
    let mut start = 0;
    for (count, (at, _)) in text.char_indices().enumerate() {
        if count > 0 && count % n == 0 {
            out.extend(text.get(start..at).map(str::to_string));
            start = at;
        }
    }
    out.extend(text.get(start..).map(str::to_string));
    out
}

/// The offline token estimate: one token per 4 characters, rounded up.
pub(crate) fn estimate_tokens(chars: usize) -> u64 {
    chars.div_ceil(4) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_split_on_characters_not_bytes() {
        assert_eq!(chunk_chars("a†bc€d", 2), vec!["a†", "bc", "€d"]);
        assert_eq!(chunk_chars("", 3), Vec::<String>::new());
        assert_eq!(chunk_chars("abc", 0), vec!["a", "b", "c"]);
        assert_eq!(chunk_chars("abc", 3), vec!["abc"]);
        assert_eq!(chunk_chars("a†b", 3), vec!["a†b"], "5 bytes, 3 characters");
        assert_eq!(chunk_chars("a†b€", 3), vec!["a†b", "€"]);
    }

    #[test]
    fn turns_need_exactly_one_body() {
        let e =
            Script::parse(r#"{"turns": [{"text": "a", "solution": {}}]}"#, "s.json").unwrap_err();
        assert_eq!(e.code(), "llm.script_invalid");
        assert!(e.to_string().contains("turn 0"), "{e}");
        let e = Script::parse(r#"{"turns": [{"txt": "a"}]}"#, "s.json").unwrap_err();
        assert_eq!(e.code(), "llm.script_invalid");
        let e = Script::parse(r#"{"turns": [{"text": "a", "chunk_chars": 0}]}"#, "s").unwrap_err();
        assert!(e.to_string().contains("chunk_chars"), "{e}");
        let e = Script::parse(r#"{"turns": [{"error": {"status": 200}}]}"#, "s").unwrap_err();
        assert!(e.to_string().contains("400-599"), "{e}");
    }

    #[test]
    fn tool_mode_renders_calls_and_final_output() {
        let s = Script::parse(
            r#"{"turns": [{"solution": {"calls": [{"_tool": "a", "x": 1}], "output": 5},
                "chunk_chars": 4}]}"#,
            "s",
        )
        .unwrap();
        let Rendered::ToolCalls(calls) = s.turns[0].render(true, 0) else {
            panic!("expected tool calls")
        };
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "a");
        assert_eq!(calls[0].argument_chunks.concat(), r#"{"x":1}"#);
        assert_eq!(calls[1].name, FINAL_OUTPUT_TOOL);
        assert_eq!(calls[1].argument_chunks.concat(), r#"{"output":5}"#);
    }
}
