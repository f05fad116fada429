//! The plan parser's contract (spec/parser.md): event logs of representative solutions
//! (snapshots), equivalence with a whole-text parse under any chunking (proptest), and typed
//! errors at the right byte offset for malformed or truncated text.

#[path = "common/plan_gen.rs"]
mod plan_gen;

use dagloop::plan::{ParseErrorKind, ParseEvent, SolutionParser};
use dagloop::protocol::{Call, Solution};
use insta::assert_json_snapshot;
use plan_gen::*;
use proptest::prelude::*;
use serde_json::{Value, json};

const TWO_CALLS: &str = r#"{"calls": [{"_tool": "search", "q": "rust", "_outputPath": "†state.hits"}, {"_tool": "summarise", "text": "†state.hits"}], "output": null}"#;

#[test]
fn calls_then_output() {
    assert_json_snapshot!(log(TWO_CALLS));
}

#[test]
fn output_before_calls() {
    let text =
        r#"{"output": {"status": "done", "n": [1, 2.5, -3e2]}, "calls": [{"_tool": "notify"}]}"#;
    assert_json_snapshot!(log(text));
}

#[test]
fn fenced_with_trailing_prose() {
    let text = "```json\n{\"calls\": [{\"_tool\": \"a\"}],\n \"output\": null}\n```\nAnything {\"after\": 1} is ignored.";
    assert_json_snapshot!(log(text));
}

#[test]
fn prose_before_the_object() {
    let text =
        "Sure! I will look it up {first}.\n\n{\"calls\": [{\"_tool\": \"lookup\", \"id\": 7}]}";
    assert_json_snapshot!(log(text));
}

#[test]
fn nested_strings_with_braces_and_escaped_quotes() {
    let text = r#"{"calls": [{"_tool": "shell", "cmd": "echo \"}]\" {\\\"", "nested": {"a": ["}", "{", "]"], "b": {"c": "\\"}}}, {"_tool": "b"}], "output": "a } b"}"#;
    assert_json_snapshot!(log(text));
}

#[test]
fn unicode_escapes() {
    let text = r#"{"calls": [{"_tool": "say", "text": "caf\u00e9 \ud83d\ude00 \u0000 \u2020"}], "output": "\u00c0"}"#;
    assert_json_snapshot!(log(text));
}

#[test]
fn multibyte_utf8_split_across_chunks() {
    let text =
        "{\"calls\": [{\"_tool\": \"say\", \"text\": \"é ✓ 😀 †state\"}], \"output\": \"ü\"}";
    let bytes = text.as_bytes();
    // Cut inside each multi-byte character (2, 3 and 4 bytes long).
    let inside: Vec<usize> = ["é", "✓", "😀", "ü"]
        .iter()
        .filter_map(|c| text.find(c).map(|at| at + 1))
        .collect();
    assert_eq!(inside.len(), 4);
    let whole = run_cuts(bytes, &[]);
    let split = run_cuts(bytes, &inside);
    assert_eq!(events_of(&split), events_of(&whole));
    assert_eq!(split.1, Ok(()));
    assert_json_snapshot!(log(text));
}

#[test]
fn empty_calls() {
    assert_json_snapshot!(log(r#"{"calls": [], "output": {"answer": 42}}"#));
}

#[test]
fn calls_null() {
    assert_json_snapshot!(log(r#"{"calls": null, "output": "finished"}"#));
}

#[test]
fn thoughts_meta_and_unknown_fields_are_kept_and_reported() {
    let text = r#"{"thoughts": "think", "meta": {"v": 1}, "confidence": 0.9, "calls": [], "output": null, "z": [true]}"#;
    assert_json_snapshot!(log(text));
}

#[test]
fn invalid_calls_are_reported_and_parsing_goes_on() {
    let text = r#"{"calls": [{"_tool": "a", "_outputMethod": "overwrite"}, 17, {"q": 1}, {"_tool": "b"}], "output": null}"#;
    let run = run_chunks(text.as_bytes(), 4);
    let codes: Vec<_> = events_of(&run)
        .iter()
        .filter_map(|e| match e {
            ParseEvent::Call { index, call, .. } => {
                Some((*index, call.as_ref().err().map(|e| e.code())))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        codes,
        vec![
            (0, Some("protocol.unknown_output_method")),
            (1, Some("protocol.not_an_object")),
            (2, Some("protocol.missing_field")),
            (3, None),
        ]
    );
    assert_json_snapshot!(log(text));
}

#[test]
fn each_call_comes_out_the_moment_its_closing_brace_arrives() {
    let text = TWO_CALLS.as_bytes();
    let first_end = TWO_CALLS.find("hits\"}").map(|i| i + 6).unwrap();
    let second_end = TWO_CALLS.find("hits\"}]").map(|i| i + 6).unwrap();
    let mut p = SolutionParser::new();
    assert!(p.feed_bytes(&text[..first_end - 1]).is_empty());
    let got = p.feed_bytes(&text[first_end - 1..first_end]);
    assert!(
        matches!(&got[..], [ParseEvent::Call { index: 0, call: Ok(c), .. }] if c.tool == "search")
    );
    assert!(p.feed_bytes(&text[first_end..second_end - 1]).is_empty());
    let got = p.feed_bytes(&text[second_end - 1..second_end]);
    assert!(matches!(
        &got[..],
        [ParseEvent::Call {
            index: 1,
            call: Ok(_),
            ..
        }]
    ));
}

/// A malformed text: what came out before the error, and the error.
fn failure(text: &str) -> Value {
    let one = run_chunks(text.as_bytes(), 1);
    // Whatever the chunking, the same events and the same error.
    for size in 2..=text.len().max(2) {
        let other = run_chunks(text.as_bytes(), size);
        assert_eq!(events_of(&other), events_of(&one), "chunks of {size}");
        assert_eq!(other.1, one.1, "chunks of {size}");
    }
    let calls: Vec<Value> = events_of(&one).iter().map(describe).collect();
    let error = one.1.as_ref().err().map(describe_error);
    assert!(error.is_some(), "no error for {text:?}");
    json!({"events": calls, "error": error})
}

/// The error's offset, code and call index for a text fed whole.
fn error_of(text: &str) -> (usize, &'static str, Option<usize>) {
    let mut p = SolutionParser::new();
    p.feed(text);
    let e = p.finish().expect_err("an error");
    (e.offset, e.code(), e.call_index)
}

#[test]
fn unclosed_string_is_truncation_at_the_end_after_the_calls_before_it() {
    let text = r#"{"calls": [{"_tool": "a"}, {"_tool": "b", "q": "abc"#;
    assert_eq!(error_of(text), (text.len(), "plan.truncated", Some(1)));
    assert_json_snapshot!(failure(text));
}

#[test]
fn unclosed_string_running_into_a_newline_fails_at_the_newline() {
    let text = "{\"calls\": [{\"_tool\": \"a\"}], \"output\": \"abc\n}";
    assert_eq!(
        error_of(text),
        (text.find('\n').unwrap(), "plan.control_character", None)
    );
}

#[test]
fn missing_comma_between_calls_fails_at_the_second_call() {
    let text = r#"{"calls": [{"_tool": "a"} {"_tool": "b"}]}"#;
    assert_eq!(error_of(text), (26, "plan.unexpected", Some(1)));
    assert_json_snapshot!(failure(text));
}

#[test]
fn missing_comma_between_fields_fails_at_the_second_key() {
    let text = r#"{"calls": [{"_tool": "a"}] "output": 1}"#;
    assert_eq!(
        error_of(text),
        (text.find("\"output").unwrap(), "plan.unexpected", None)
    );
}

#[test]
fn garbage_inside_the_object_fails_at_the_first_bad_byte() {
    let text = r#"{"calls": [{"_tool": "a"}], "output": 1 x}"#;
    assert_eq!(
        error_of(text),
        (text.find('x').unwrap(), "plan.unexpected", None)
    );
    assert_json_snapshot!(failure(text));
}

#[test]
fn truncated_mid_call_after_two_calls_keeps_both() {
    let text =
        r#"Plan: {"calls": [{"_tool": "a"}, {"_tool": "b", "n": [1, 2]}, {"_tool": "c", "p": {"#;
    assert_eq!(error_of(text), (text.len(), "plan.truncated", Some(2)));
    assert_json_snapshot!(failure(text));
}

#[test]
fn offsets_count_every_byte_of_the_prose_before_the_object() {
    let prefix = "Voilà ✓ — here:\n```json\n";
    let text = format!("{prefix}{{\"output\": 1,}}");
    let comma = prefix.len() + 12;
    assert_eq!(&text[comma..=comma], ",");
    assert_eq!(error_of(&text), (comma + 1, "plan.unexpected", None));
}

#[test]
fn text_without_an_object_has_no_solution() {
    assert_eq!(error_of(""), (0, "plan.no_solution", None));
    let prose = "I cannot help with {that}.";
    assert_eq!(error_of(prose), (prose.len(), "plan.no_solution", None));
}

#[test]
fn a_json_value_that_is_not_an_object_is_named() {
    for (text, found, at) in [
        ("[1, 2]", "an array", 0),
        ("```json\n[\"a\", {\"b\": 1}]\n```\n", "an array", 8),
        ("  \"{\\\"calls\\\": []}\"", "a string", 2),
        ("42", "a number", 0),
        ("-1.5e3\n", "a number", 0),
        ("null", "null", 0),
        ("true", "a boolean", 0),
        ("[1, 2", "an array", 0),
    ] {
        for chunk in [1, 3, 64] {
            let run = run_chunks(text.as_bytes(), chunk);
            let e = run.1.clone().unwrap_err();
            assert_eq!(
                (e.code(), e.offset, e.kind.to_string()),
                (
                    "plan.not_an_object",
                    at,
                    format!("the Solution must be a JSON object, found {found}")
                ),
                "{text:?}"
            );
        }
    }
    // An object inside an array is not the solution: refused as soon as it starts.
    let text = r#"[{"_tool": "a"}, {"_tool": "b"}]"#;
    let run = run_chunks(text.as_bytes(), 1);
    assert!(events_of(&run).is_empty());
    let e = run.1.unwrap_err();
    assert_eq!((e.code(), e.offset), ("plan.not_an_object", 0));
    // Prose that merely starts like JSON stays prose, and a solution after it is found.
    for prose in [
        "1. Look it up",
        "true story",
        "null hypothesis",
        "\"Quoted\" words",
        "[see below]",
    ] {
        assert_eq!(
            error_of(prose),
            (prose.len(), "plan.no_solution", None),
            "{prose}"
        );
        let text = format!("{prose} {{\"calls\": [], \"output\": 1}}");
        assert_eq!(run_chunks(text.as_bytes(), 2).1, Ok(()), "{text}");
    }
    // A complete array followed by a solution: the solution counts.
    let text = r#"[1] {"calls": [], "output": 1}"#;
    assert_eq!(run_chunks(text.as_bytes(), 1).1, Ok(()));
}

#[test]
fn error_messages() {
    let messages: Vec<String> = [
        r#"{"calls": [{"_tool": "a"} {"_tool": "b"}]}"#,
        r#"{"calls": [{"_tool": "a", "p": "x"#,
        "{\"output\": \"a\tb\"}",
        r#"{"output": "\ud800"}"#,
        r#"{"calls": 1}"#,
        "no json here",
    ]
    .iter()
    .map(|t| {
        let mut p = SolutionParser::new();
        p.feed(t);
        p.finish().map_or_else(|e| e.to_string(), |_| "ok".into())
    })
    .collect();
    assert_json_snapshot!(messages);
    let kind = ParseErrorKind::Truncated { expected: "`:`" };
    assert_eq!(kind.code(), "plan.truncated");
}

/// The reference: what parsing the whole text with serde_json gives.
fn reference(object: &Value) -> (Vec<Value>, Solution) {
    let mut m = object.as_object().cloned().unwrap_or_default();
    let elements = match m.remove("calls") {
        Some(Value::Array(items)) => items,
        _ => Vec::new(),
    };
    let calls = elements
        .iter()
        .filter_map(|e| Call::try_from(e.clone()).ok())
        .collect();
    let solution = Solution {
        calls,
        output: m.remove("output").unwrap_or(Value::Null),
        meta: m.remove("meta"),
        thoughts: m.remove("thoughts"),
        extra: m,
    };
    (elements, solution)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any valid solution, any chunking: the calls and the solution of a whole-text parse.
    #[test]
    fn any_chunking_gives_the_calls_and_solution_of_the_whole(
        (object, style) in solution_object(true),
        (before, after) in wrapper(),
        cut in cuts(),
    ) {
        let json = render(&object, style);
        let text = format!("{before}{json}{after}");
        let whole: Value = serde_json::from_str(&json).unwrap();
        let expected = Solution::from_value(whole.clone()).unwrap();
        let (elements, _) = reference(&whole);
        let run = run_cuts(text.as_bytes(), &positions(text.len(), &cut));
        prop_assert_eq!(&run.1, &Ok(()));
        let events = events_of(&run);
        let calls: Vec<_> = events.iter().filter_map(|e| match e {
            ParseEvent::Call { index, call, raw } => Some((*index, call.clone(), raw.clone())),
            _ => None,
        }).collect();
        let want: Vec<_> = elements.iter().enumerate()
            .map(|(i, e)| (i, Call::try_from(e.clone()), e.clone())).collect();
        prop_assert_eq!(calls, want);
        let outputs: Vec<_> = events.iter().filter_map(|e| match e {
            ParseEvent::Output(v) => Some(v.clone()),
            _ => None,
        }).collect();
        prop_assert_eq!(outputs, whole.get("output").cloned().into_iter().collect::<Vec<_>>());
        prop_assert_eq!(events.last(), Some(&ParseEvent::Solution(expected)));
    }

    /// Invalid calls included: each element is reported as `Call::try_from` sees it, and the
    /// final solution keeps the valid ones in order.
    #[test]
    fn invalid_calls_never_stop_the_stream((object, style) in solution_object(false), cut in cuts()) {
        let text = render(&object, style);
        let whole: Value = serde_json::from_str(&text).unwrap();
        let (elements, solution) = reference(&whole);
        let run = run_cuts(text.as_bytes(), &positions(text.len(), &cut));
        prop_assert_eq!(&run.1, &Ok(()));
        let events = events_of(&run);
        let raws: Vec<_> = events.iter().filter_map(|e| match e {
            ParseEvent::Call { raw, call, .. } => {
                assert_eq!(call, &Call::try_from(raw.clone()));
                Some(raw.clone())
            }
            _ => None,
        }).collect();
        prop_assert_eq!(raws, elements);
        prop_assert_eq!(events.last(), Some(&ParseEvent::Solution(solution)));
    }

    /// Cut anywhere, a valid text gives the events whose last byte arrived, then a truncation
    /// (or no-solution) error at the cut.
    #[test]
    fn truncation_anywhere_keeps_what_was_complete(
        (object, style) in solution_object(false),
        (before, _) in wrapper(),
        at in any::<prop::sample::Index>(),
    ) {
        let text = format!("{before}{}", render(&object, style));
        let full = run_chunks(text.as_bytes(), 1);
        let cut = at.index(text.len());
        let part = run_chunks(&text.as_bytes()[..cut], 7);
        let want: Vec<_> = full.0.iter().filter(|(n, _)| *n <= cut).map(|(_, e)| e.clone()).collect();
        prop_assert_eq!(events_of(&part), want);
        let e = part.1.clone().unwrap_err();
        prop_assert_eq!(e.offset, cut);
        prop_assert!(["plan.truncated", "plan.no_solution"].contains(&e.code()), "{}", e);
    }

    /// Hostile bytes or damaged solutions: no panic, the same outcome under any chunking, and a
    /// complete solution always lists exactly the valid calls that came out.
    #[test]
    fn hostile_input_never_panics_and_ignores_chunking(
        text in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..256),
            (solution_object(false), prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4))
                .prop_map(|((v, style), edits)| {
                    let mut t = render(&v, style).into_bytes();
                    for (at, b) in edits {
                        let i = at.index(t.len() + 1);
                        if b % 3 == 0 && i < t.len() { t.remove(i); } else { t.insert(i, b); }
                    }
                    t
                }),
        ],
        cut in cuts(),
    ) {
        let whole = run_cuts(&text, &[]);
        let split = run_cuts(&text, &positions(text.len(), &cut));
        prop_assert_eq!(events_of(&split), events_of(&whole));
        prop_assert_eq!(&split.1, &whole.1);
        let events = events_of(&whole);
        match &whole.1 {
            Ok(()) => {
                let oks: Vec<Call> = events.iter().filter_map(|e| match e {
                    ParseEvent::Call { call: Ok(c), .. } => Some(c.clone()),
                    _ => None,
                }).collect();
                let Some(ParseEvent::Solution(s)) = events.last() else {
                    return Err(TestCaseError::fail("no solution event"));
                };
                prop_assert_eq!(&s.calls, &oks);
            }
            Err(e) => prop_assert!(e.offset <= text.len()),
        }
    }
}
