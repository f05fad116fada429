//! What the model is told when its answer was not a Solution: the problem in words, with what
//! was received (in short), and what was expected.
//!
//! The engine keeps a [`Received`] of each answer's text as it streams and, when the turn ends,
//! turns a parse error, unknown top-level fields or an empty answer into a [`Problem`] (code
//! and words, journaled); the machine shows it in the next Request through [`render`], and
//! names the last one in the run's error when the run ends on a limit. Pure functions: no IO.
//!
//! Deliberately not here: reading the text (the `plan` parser), deciding whether a turn counts
//! as empty (the machine), or the errors of single calls (the scheduler's, shown as error
//! messages of the plan).

use serde_json::Value;

use crate::plan::{ParseError, ParseErrorKind};

/// Characters of an answer's text kept for the excerpt.
const HEAD_CHARS: usize = 240;
/// Most characters an excerpt shows.
const EXCERPT_CHARS: usize = 80;

/// The start of an answer's text and its length, for the excerpt a correction quotes.
#[derive(Debug, Clone, Default)]
pub struct Received {
    head: String,
    chars: usize,
}

impl Received {
    /// Takes the next piece of text.
    pub fn push(&mut self, text: &str) {
        let room = HEAD_CHARS.saturating_sub(self.chars);
        if room > 0 {
            self.head.extend(text.chars().take(room));
        }
        self.chars = self.chars.saturating_add(text.chars().count());
    }

    /// Characters received.
    pub fn chars(&self) -> usize {
        self.chars
    }

    /// True when the text has nothing but blanks.
    pub fn is_blank(&self) -> bool {
        self.head.trim().is_empty() && self.chars <= HEAD_CHARS
    }

    /// The text, in short: see [`excerpt`].
    pub fn excerpt(&self) -> String {
        excerpt_of(&self.head, self.chars > HEAD_CHARS)
    }
}

/// A text in short, to quote it on one line: blanks collapsed, at most 80 characters, `…` when
/// cut, between backticks.
pub fn excerpt(text: &str) -> String {
    excerpt_of(text, false)
}

fn excerpt_of(text: &str, more: bool) -> String {
    let mut out = String::new();
    let mut n = 0;
    let mut blank = false;
    let mut cut = more;
    for c in text.chars() {
        if c.is_whitespace() {
            blank = n > 0;
            continue;
        }
        if n + usize::from(blank) >= EXCERPT_CHARS {
            cut = true;
            break;
        }
        if blank {
            out.push(' ');
            n += 1;
            blank = false;
        }
        out.push(if c.is_control() { '\u{FFFD}' } else { c });
        n += 1;
    }
    if cut {
        out.push('…');
    }
    format!("`{out}`")
}

/// What was wrong with an answer: a stable code (`plan.*`) and the problem in words (what was
/// received, in short), without the expectation [`render`] adds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// A stable code: a parse error's (`plan.no_solution`, `plan.not_an_object`,
    /// `plan.calls_not_array`, `plan.truncated`...), `plan.empty`, `plan.no_tool_call` or
    /// `plan.unknown_fields`.
    pub code: &'static str,
    /// The problem, in words meant for the model, starting with "it" (the response).
    pub message: String,
}

/// An answer with no text (structured-output mode) or with neither text nor a tool call
/// (tool-call mode).
pub fn empty(tool_mode: bool) -> Problem {
    if tool_mode {
        Problem {
            code: "plan.no_tool_call",
            message: "it was empty: no tool call and no text".into(),
        }
    } else {
        Problem {
            code: "plan.empty",
            message: "it was empty".into(),
        }
    }
}

/// A tool-call mode answer that called no tool and held no Solution in its text.
pub fn no_tool_call(received: &Received) -> Problem {
    Problem {
        code: "plan.no_tool_call",
        message: format!(
            "it called no tool; it is {} of text: {}",
            characters(received.chars()),
            received.excerpt()
        ),
    }
}

/// The text could not be read as a Solution. `at_token_limit`: the model stopped because it
/// reached its output token limit.
pub fn parse_error(e: &ParseError, received: &Received, at_token_limit: bool) -> Problem {
    let got = received.excerpt();
    let mut message = match &e.kind {
        ParseErrorKind::NoSolution => format!(
            "it contains no JSON object; it is {} of text: {got}",
            characters(received.chars())
        ),
        ParseErrorKind::NotAnObject { found } => {
            let what = match *found {
                "null" => "JSON `null`".to_string(),
                f => format!(
                    "a JSON {}",
                    f.trim_start_matches("an ").trim_start_matches("a ")
                ),
            };
            format!("it is {what}, not an object: {got}")
        }
        ParseErrorKind::CallsNotArray { found } => format!(
            "its `calls` is {found}, not an array (at byte {}): {got}",
            e.offset
        ),
        kind => {
            let inside = e
                .call_index
                .map(|i| format!(" (in calls[{i}])"))
                .unwrap_or_default();
            format!(
                "it could not be read at byte {}{inside}: {kind}; it is {} of text: {got}",
                e.offset,
                characters(received.chars())
            )
        }
    };
    if at_token_limit {
        message.push_str("; it stopped at the output token limit");
    }
    Problem {
        code: e.code(),
        message,
    }
}

/// Top-level members a Solution does not have (their values were ignored).
pub fn unknown_fields(fields: &[(String, Value)]) -> Problem {
    let list: Vec<String> = fields
        .iter()
        .map(|(k, v)| excerpt(&format!("{}: {v}", Value::from(k.as_str()))))
        .collect();
    Problem {
        code: "plan.unknown_fields",
        message: format!(
            "it has fields a Solution does not have, which were ignored: {}",
            list.join(", ")
        ),
    }
}

/// What a Solution must look like, for a problem with this code.
pub fn expected(code: &str) -> &'static str {
    match code {
        "plan.unknown_fields" => {
            "A Solution has only the fields \"calls\", \"output\", \"thoughts\" and \"meta\": \
             tool calls go in \"calls\" and the final answer in \"output\"."
        }
        "plan.no_tool_call" => {
            "Call the tools you need, and call final_output with the output when you are done."
        }
        "plan.calls_not_array" => {
            "\"calls\" must be an array of calls, [{\"_tool\": \"<tool name>\", <params>...}, ...], \
             or null."
        }
        _ => {
            "Answer with one JSON object and nothing else: {\"calls\": [{\"_tool\": \"<tool name>\", \
             <params>...}, ...], \"output\": null} while work remains, or with \"output\" set to \
             the final output (matching the output schema) when you are done."
        }
    }
}

/// The words the next Request carries for a problem: what was wrong, what was received and
/// what was expected. A problem without a code (journaled by an older dagloop) is shown as
/// it was written.
pub fn render(code: Option<&str>, message: &str) -> String {
    match code {
        Some(code) => format!(
            "Your previous response was not a valid Solution: {message}. {}",
            expected(code)
        ),
        None => format!("Your previous response had a problem: {message}"),
    }
}

fn characters(n: usize) -> String {
    if n == 1 {
        "1 character".into()
    } else {
        format!("{n} characters")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn received(text: &str) -> Received {
        let mut r = Received::default();
        for piece in text.as_bytes().chunks(7) {
            r.push(&String::from_utf8_lossy(piece));
        }
        r
    }

    #[test]
    fn excerpts_are_one_short_line() {
        assert_eq!(excerpt("  a\n\n b\tc "), "`a b c`");
        let long = "word ".repeat(40);
        let e = excerpt(&long);
        assert!(e.ends_with("…`"), "{e}");
        assert!(e.chars().count() <= EXCERPT_CHARS + 3, "{e}");
        // Only the head is kept, and the excerpt says there was more.
        let r = received(&"x".repeat(1000));
        assert_eq!(r.chars(), 1000);
        assert!(r.excerpt().ends_with("…`"));
        assert!(received(" \n ").is_blank());
        assert!(!received(&format!("{} y", " ".repeat(300))).is_blank());
    }

    #[test]
    fn every_problem_says_what_was_received_and_what_was_expected() {
        let mut p = crate::plan::SolutionParser::new();
        p.feed("[1, 2]");
        let e = p.finish().unwrap_err();
        let problem = parse_error(&e, &received("[1, 2]"), false);
        assert_eq!(problem.code, "plan.not_an_object");
        assert_eq!(
            render(Some(problem.code), &problem.message),
            "Your previous response was not a valid Solution: it is a JSON array, not an object: \
             `[1, 2]`. Answer with one JSON object and nothing else: {\"calls\": [{\"_tool\": \
             \"<tool name>\", <params>...}, ...], \"output\": null} while work remains, or with \
             \"output\" set to the final output (matching the output schema) when you are done."
        );
        let u = unknown_fields(&[("answer".into(), json!(42))]);
        assert_eq!(
            u.message,
            "it has fields a Solution does not have, which were ignored: `\"answer\": 42`"
        );
        assert_eq!(
            render(None, "legacy words"),
            "Your previous response had a problem: legacy words"
        );
    }
}
