//! Unit tests for the scanner and the parser internals (limits, error locations, prefix rules).

use proptest::prelude::*;
use serde_json::{Value, json};

use super::capture::locate;
use super::scan::{Scanner, Sig};
use super::*;

/// Runs the scanner over a whole text; `Ok(signals)` if it is one complete JSON value.
fn scan_all(text: &[u8], max_depth: usize) -> Result<Vec<(usize, Sig)>, (usize, ParseErrorKind)> {
    let mut s = Scanner::new(max_depth);
    let mut sigs = Vec::new();
    let mut i = 0;
    while i < text.len() {
        if s.expected() == "nothing" {
            // Only blanks may follow the root value.
            if !text[i].is_ascii_whitespace() {
                let kind = ParseErrorKind::Unexpected {
                    found: text[i],
                    expected: "nothing",
                };
                return Err((i, kind));
            }
            i += 1;
            continue;
        }
        let sig = s.push(text[i]).map_err(|k| (i, k))?;
        if sig != Sig::None {
            sigs.push((i, sig));
        }
        if !matches!(sig, Sig::EndBefore(_)) {
            i += 1;
        }
    }
    let expected = s.expected();
    // The end of the text ends a root number, as a delimiter would.
    match s.push(b' ') {
        _ if expected == "nothing" => Ok(sigs),
        Ok(Sig::EndBefore(0)) => Ok(sigs),
        _ => Err((text.len(), ParseErrorKind::Truncated { expected })),
    }
}

fn parse(text: &[u8]) -> (Vec<ParseEvent>, Result<(), ParseError>) {
    parse_with(text, Limits::default())
}

fn parse_with(text: &[u8], limits: Limits) -> (Vec<ParseEvent>, Result<(), ParseError>) {
    let mut p = SolutionParser::with_limits(limits);
    let mut events = p.feed_bytes(text);
    let end = p.finish().map(|tail| events.extend(tail));
    (events, end)
}

fn err_of(text: &[u8]) -> ParseError {
    match parse(text).1 {
        Err(e) => e,
        Ok(()) => panic!("expected an error for {:?}", String::from_utf8_lossy(text)),
    }
}

#[test]
fn scanner_reports_where_keys_and_values_begin_and_end() {
    let sigs = scan_all(br#"{"a": [1, true], "b":"x"}"#, 8).unwrap();
    assert_eq!(
        sigs,
        vec![
            (0, Sig::Start(0)),
            (1, Sig::KeyStart(1)),
            (3, Sig::KeyEnd(1)),
            (6, Sig::Start(1)),
            (7, Sig::Start(2)),
            (8, Sig::EndBefore(2)),
            (10, Sig::Start(2)),
            (13, Sig::End(2)),
            (14, Sig::End(1)),
            (17, Sig::KeyStart(1)),
            (19, Sig::KeyEnd(1)),
            (21, Sig::Start(1)),
            (23, Sig::End(1)),
            (24, Sig::End(0)),
        ]
    );
}

#[test]
fn scanner_rejects_what_json_forbids_at_the_offending_byte() {
    let cases: &[(&[u8], usize, &str)] = &[
        (b"[01]", 2, "plan.unexpected"),
        (b"[1,]", 3, "plan.unexpected"),
        (b"{,}", 1, "plan.unexpected"),
        (b"[1.]", 3, "plan.unexpected"),
        (b"[-]", 2, "plan.unexpected"),
        (b"[1e]", 3, "plan.unexpected"),
        (b"[tru]", 4, "plan.unexpected"),
        (b"{\"a\" 1}", 5, "plan.unexpected"),
        (b"[\"a\nb\"]", 3, "plan.control_character"),
        (b"[\"\\x\"]", 3, "plan.invalid_escape"),
        (b"[\"\\u12g4\"]", 6, "plan.invalid_escape"),
        (b"[\"\\udc00\"]", 7, "plan.unpaired_surrogate"),
        (b"[\"\\ud800x\"]", 8, "plan.unpaired_surrogate"),
        (b"[\"\\ud800\\u0041\"]", 13, "plan.unpaired_surrogate"),
        (b"[\"\xC0\x80\"]", 2, "plan.invalid_utf8"),
        (b"[\"\xFF\"]", 2, "plan.invalid_utf8"),
        (b"[\"\xE0\x80\x80\"]", 3, "plan.invalid_utf8"),
        (b"[\"\xED\xA0\x80\"]", 3, "plan.invalid_utf8"),
        (b"[\"\xF4\x90\x80\x80\"]", 3, "plan.invalid_utf8"),
        (b"[\"\xC3\"]", 3, "plan.invalid_utf8"),
        (b"[\xC3\xA9]", 1, "plan.unexpected"),
        (b"[[[[1]]]]", 3, "plan.too_deep"),
    ];
    for (text, at, code) in cases {
        let (pos, kind) = scan_all(text, 3).expect_err(&String::from_utf8_lossy(text));
        assert_eq!(
            (pos, kind.code()),
            (*at, *code),
            "{}",
            String::from_utf8_lossy(text)
        );
    }
}

#[test]
fn scanner_accepts_escapes_pairs_and_multibyte_text() {
    for text in [
        &br#"["\"\\\/\b\f\n\r\t", "\u00e9\ud83d\ude00", "\u0000"]"#[..],
        "[\"é ✓ 😀 \u{7f}\"]".as_bytes(),
        b"[-0, 0.5, -1.25e+10, 3E-2, 10, 1e5]",
        b" {\"a\":{\"b\":[null,false,true,{}]} } ",
    ] {
        assert!(
            scan_all(text, 8).is_ok(),
            "{}",
            String::from_utf8_lossy(text)
        );
        assert!(serde_json::from_slice::<Value>(text).is_ok());
    }
}

#[test]
fn truncation_says_what_was_expected() {
    let expect = |text: &[u8]| match scan_all(text, 8) {
        Err((_, ParseErrorKind::Truncated { expected })) => expected,
        other => panic!("{other:?}"),
    };
    assert_eq!(expect(b"{"), "a key or `}`");
    assert_eq!(expect(b"{\"a\""), "`:`");
    assert_eq!(expect(b"{\"a\":"), "a value");
    assert_eq!(expect(b"[1,"), "a value");
    assert_eq!(expect(b"["), "a value or `]`");
    assert_eq!(expect(b"{\"a\":1,"), "a key");
    assert_eq!(expect(b"[\"ab"), "the rest of a string");
    assert_eq!(expect(b"{\"ab"), "the rest of a key");
    assert_eq!(expect(b"[tr"), "the rest of `true`");
    assert_eq!(expect(b"[1"), "the rest of a number");
    assert_eq!(expect(b"[1 "), "`,` or `]`");
}

/// Bytes likely to form or nearly form JSON, to compare the scanner with serde_json.
fn jsonish() -> impl Strategy<Value = Vec<u8>> {
    let atoms = prop::sample::select(vec![
        "{",
        "}",
        "[",
        "]",
        ":",
        ",",
        "\"",
        "\"a\"",
        "\\",
        "\\u",
        "d83d",
        "de00",
        "00e9",
        "0",
        "1",
        "-",
        ".",
        "e",
        "+",
        "true",
        "fals",
        "null",
        " ",
        "\n",
        "é",
        "\u{1F600}",
        "n",
        "x",
    ]);
    prop::collection::vec(atoms, 0..24).prop_map(|v| v.concat().into_bytes())
}

/// Valid JSON texts (compact or pretty, some with `\u` escapes), then maybe one byte changed.
fn mutated_json() -> impl Strategy<Value = Vec<u8>> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        ".{0,6}".prop_map(Value::from),
    ];
    let value = leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map(".{0,4}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    });
    (
        value,
        any::<bool>(),
        any::<prop::sample::Index>(),
        any::<u8>(),
        0..4u8,
    )
        .prop_map(|(v, pretty, at, byte, op)| {
            let text = if pretty {
                serde_json::to_vec_pretty(&v)
            } else {
                serde_json::to_vec(&v)
            };
            let mut text = text.unwrap_or_default();
            if !text.is_empty() {
                let i = at.index(text.len());
                match op {
                    0 => text[i] = byte,
                    1 => {
                        text.remove(i);
                    }
                    2 => text.insert(i, byte),
                    _ => {}
                }
            }
            text
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// The scanner accepts exactly what serde_json accepts as one JSON value.
    #[test]
    fn scanner_agrees_with_serde_json(text in prop_oneof![jsonish(), mutated_json()]) {
        let ours = scan_all(&text, 128).is_ok();
        match serde_json::from_slice::<Value>(&text) {
            Err(e) if e.to_string().contains("number out of range") => {}
            theirs => prop_assert_eq!(ours, theirs.is_ok(), "{:?}", String::from_utf8_lossy(&text)),
        }
    }
}

#[test]
fn a_number_out_of_f64_range_is_an_invalid_value_located_in_the_value() {
    let text = br#"{"calls": [{"_tool": "a", "n": 1e400}]}"#;
    let e = err_of(text);
    assert_eq!(e.code(), "plan.invalid_value");
    assert_eq!(e.call_index, Some(0));
    assert_eq!(
        e.kind,
        ParseErrorKind::InvalidValue {
            reason: "number out of range".into()
        }
    );
    let number = 31..36;
    assert!(
        number.contains(&e.offset),
        "offset {} not in {number:?}",
        e.offset
    );
}

#[test]
fn locate_maps_serde_positions_to_byte_indices() {
    assert_eq!(locate(b"abc", 1, 2), 1);
    assert_eq!(locate(b"a\nbc\nde", 3, 2), 6);
    assert_eq!(locate(b"ab", 9, 9), 1);
}

#[test]
fn a_value_may_be_exactly_as_large_as_the_limit_but_not_larger() {
    let limits = Limits {
        max_value_bytes: 5,
        ..Limits::default()
    };
    // The output `12345` is five bytes and ends one byte later (numbers end at a delimiter).
    let (events, end) = parse_with(br#"{"output": 12345}"#, limits);
    assert!(end.is_ok(), "{end:?}");
    assert_eq!(events[0], ParseEvent::Output(json!(12345)));
    let e = parse_with(br#"{"output": "1234"}"#, limits).1.unwrap_err();
    assert_eq!((e.code(), e.offset), ("plan.too_large", 16));
    assert_eq!(
        e.kind,
        ParseErrorKind::TooLarge {
            what: "value",
            limit: 5
        }
    );
}

#[test]
fn a_call_larger_than_the_limit_fails_after_the_earlier_calls() {
    let limits = Limits {
        max_value_bytes: 16,
        ..Limits::default()
    };
    let text = br#"{"calls": [{"_tool": "a"}, {"_tool": "bbbbbbbbbbb"}]}"#;
    let (events, end) = parse_with(text, limits);
    assert_eq!(events.len(), 1);
    let e = end.unwrap_err();
    assert_eq!(
        (e.code(), e.offset, e.call_index),
        ("plan.too_large", 27 + 16, Some(1))
    );
}

#[test]
fn keys_and_the_whole_text_are_bounded_too() {
    let limits = Limits {
        max_key_bytes: 4,
        ..Limits::default()
    };
    let e = parse_with(br#"{"abc": 1}"#, limits).1.unwrap_err();
    assert_eq!(
        (e.offset, e.kind.clone()),
        (
            5,
            ParseErrorKind::TooLarge {
                what: "key",
                limit: 4
            }
        )
    );
    assert!(parse_with(br#"{"ab": 1}"#, limits).1.is_ok());

    let limits = Limits {
        max_total_bytes: 12,
        ..Limits::default()
    };
    assert!(parse_with(b"xx {\"a\": 1}", limits).1.is_ok());
    let e = parse_with(b"xxxx {\"a\": 1} trailing", limits)
        .1
        .unwrap_err();
    assert_eq!((e.offset, e.code()), (12, "plan.too_large"));
    let e = parse_with(b"prose prose prose", limits).1.unwrap_err();
    assert_eq!((e.offset, e.code()), (12, "plan.too_large"));
}

#[test]
fn nesting_beyond_the_depth_limit_is_refused_at_the_opening_bracket() {
    let limits = Limits {
        max_depth: 4,
        ..Limits::default()
    };
    let ok = br#"{"calls": [{"_tool": "a", "p": [1]}]}"#;
    assert!(parse_with(ok, limits).1.is_ok());
    let deep = br#"{"calls": [{"_tool": "a", "p": [[1]]}]}"#;
    let e = parse_with(deep, limits).1.unwrap_err();
    assert_eq!(
        (e.code(), e.offset, e.call_index),
        ("plan.too_deep", 32, Some(0))
    );
    let hostile = "[".repeat(100_000);
    let e = parse(format!("{{\"output\": {hostile}").as_bytes())
        .1
        .unwrap_err();
    assert_eq!((e.code(), e.offset), ("plan.too_deep", 11 + 127));
}

#[test]
fn the_solution_starts_at_a_brace_followed_by_a_quote_or_a_closing_brace() {
    let (events, end) = parse(b"Use {braces} {like this} then {\n  \"output\": 1}");
    assert!(end.is_ok());
    assert_eq!(events[0], ParseEvent::Output(json!(1)));
    let (events, end) = parse(b"{{ \t\"output\": 2}");
    assert!(end.is_ok());
    assert_eq!(events[0], ParseEvent::Output(json!(2)));
    let (events, end) = parse(b"The empty plan: {}.");
    assert!(end.is_ok());
    assert_eq!(events, vec![ParseEvent::Solution(Solution::default())]);
}

#[test]
fn the_parser_stops_at_the_first_error_and_after_the_solution() {
    let mut p = SolutionParser::new();
    // The number ends at the blank after it, so the output is out before the error.
    assert_eq!(
        p.feed(r#"{"output": 1 x"#),
        vec![ParseEvent::Output(json!(1))]
    );
    assert_eq!(p.error().map(ParseError::code), Some("plan.unexpected"));
    assert!(p.feed(r#"}{"calls": [{"_tool": "a"}]}"#).is_empty());
    assert_eq!(p.bytes_seen(), 14 + 28);
    assert_eq!(p.finish().unwrap_err().offset, 13);

    let mut p = SolutionParser::new();
    assert_eq!(
        p.feed(r#"{"output": 1} {"calls": [{"_tool": "a"}]}"#).len(),
        2
    );
    assert!(p.is_complete());
    assert!(p.feed("{\"output\": 3}").is_empty());
    assert_eq!(p.finish(), Ok(vec![]));
}

#[test]
fn calls_must_be_an_array_or_null() {
    for (text, found) in [
        (r#"{"calls": {"_tool": "a"}}"#, "an object"),
        (r#"{"calls": "a"}"#, "a string"),
        (r#"{"calls": 3}"#, "a number"),
        (r#"{"calls": false}"#, "a boolean"),
    ] {
        let e = err_of(text.as_bytes());
        assert_eq!(
            (e.offset, e.kind),
            (10, ParseErrorKind::CallsNotArray { found })
        );
    }
    let (events, end) = parse(br#"{"calls": null, "output": 1}"#);
    assert!(end.is_ok());
    assert_eq!(events.len(), 2);
}

#[test]
fn a_repeated_top_level_field_is_refused_at_its_second_key() {
    let e = err_of(br#"{"output": 1, "thoughts": "", "output": 2}"#);
    assert_eq!(e.offset, 30);
    assert_eq!(
        e.kind,
        ParseErrorKind::DuplicateField {
            field: "output".into()
        }
    );
    assert_eq!(
        e.to_string(),
        "malformed solution at byte 30: the field `output` appears twice in the solution"
    );
}

#[test]
fn streaming_mode_moves_valid_calls_and_keeps_raw_only_for_invalid_ones() {
    let text = r#"{"calls": [{"_tool": "a", "x": 1}, {"x": 2}, {"_tool": "b"}], "output": null}"#;
    let invalid = streaming_agrees(text);
    assert_eq!(invalid, vec![1]);
}

/// Streaming reads a call object straight into a call: every meta field, repeated key, nested
/// value and kind of invalid element gives what reading it through a value gives.
#[test]
fn streaming_reads_calls_as_reading_them_through_values_does() {
    let text = r#"{"calls": [
        {"_tool": "a", "x": 1, "_outputPath": "†state.a", "y": {"z": [1, "†state.q", null]}},
        {"x": 2},
        {"_tool": "b", "_outputMethod": "push", "_instance": 3, "_scopes": ["state"], "w": 1.5},
        {"_tool": "c", "_outputMethod": "nope"},
        {"k": 1, "_tool": "d", "k": 2, "_tool": "e", "_outputPath": null},
        {"_tool": "  ", "x": 1},
        {"_tool": "f", "_scopes": "state"},
        "just a string",
        [1, 2],
        {"_tool": "g", "_outputPath": 5},
        {"_tool": 7},
        {"_instance": "i", "_tool": "h", "_approval": "always", "_unknown": {"a": 1}}
    ], "output": null}"#;
    let invalid = streaming_agrees(text);
    // The last one carries meta keys no call has (`_approval` is a tool's): refused (issue 23).
    assert_eq!(invalid, vec![1, 3, 5, 6, 7, 8, 9, 10, 11]);
}

/// Feeds `text` to a parser keeping its calls and to a streaming one; asserts they give the
/// same calls and errors, the streaming one keeping raw values only for invalid calls. Returns
/// the indexes of the invalid calls.
fn streaming_agrees(text: &str) -> Vec<usize> {
    let mut invalid = Vec::new();
    let run = |mut p: SolutionParser| {
        let mut events = p.feed(text);
        events.extend(p.finish().expect("complete"));
        events
    };
    let full = run(SolutionParser::new());
    let streamed = run(SolutionParser::new().streaming());
    assert_eq!(full.len(), streamed.len());
    for (f, s) in full.iter().zip(&streamed) {
        match (f, s) {
            (
                ParseEvent::Call { index, call, raw },
                ParseEvent::Call {
                    index: i2,
                    call: c2,
                    raw: r2,
                },
            ) => {
                assert_eq!((index, call), (i2, c2));
                // Only the invalid element (no `_tool`) keeps its raw value.
                let expected = if call.is_ok() {
                    Value::Null
                } else {
                    raw.clone()
                };
                assert_eq!(r2, &expected);
                if call.is_err() {
                    invalid.push(*index);
                }
            }
            (ParseEvent::Solution(a), ParseEvent::Solution(b)) => {
                assert!(!a.calls.is_empty());
                assert!(b.calls.is_empty());
                assert_eq!(a.output, b.output);
            }
            (a, b) => assert_eq!(a, b),
        }
    }
    invalid
}
