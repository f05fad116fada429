//! Helpers for the plan parser tests: feeding text in chunks, describing events as JSON, and
//! proptest generators of Solution texts.

#![allow(dead_code)]

use std::fmt::Write as _;

use dagloop::plan::{ParseError, ParseEvent, SolutionParser};
use dagloop::protocol::OutputMethod;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// What one run of the parser produced: each event with the number of bytes fed when it came
/// out, then how the stream ended.
pub type Run = (Vec<(usize, ParseEvent)>, Result<(), ParseError>);

/// Feeds `text` cut at the given byte positions (any order, duplicates allowed), then finishes.
pub fn run_cuts(text: &[u8], cuts: &[usize]) -> Run {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| (*c).min(text.len())).collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut p = SolutionParser::new();
    let mut events = Vec::new();
    let mut from = 0;
    for cut in cuts.into_iter().chain([text.len()]) {
        for e in p.feed_bytes(&text[from..cut]) {
            events.push((cut, e));
        }
        from = cut;
    }
    let end = p
        .finish()
        .map(|tail| events.extend(tail.into_iter().map(|e| (text.len(), e))));
    (events, end)
}

/// Feeds `text` in chunks of `size` bytes.
pub fn run_chunks(text: &[u8], size: usize) -> Run {
    let cuts: Vec<usize> = (size..text.len()).step_by(size.max(1)).collect();
    run_cuts(text, &cuts)
}

/// The events alone, without when they came out.
pub fn events_of(run: &Run) -> Vec<ParseEvent> {
    run.0.iter().map(|(_, e)| e.clone()).collect()
}

/// An event as JSON, for snapshots.
pub fn describe(e: &ParseEvent) -> Value {
    match e {
        ParseEvent::Call {
            index,
            call: Ok(call),
            ..
        } => json!({"call": {"index": index, "ok": call}}),
        ParseEvent::Call {
            index,
            call: Err(err),
            raw,
        } => json!({"call": {
            "index": index,
            "error": {"code": err.code(), "message": err.to_string()},
            "raw": raw,
        }}),
        ParseEvent::Output(v) => json!({"output": v}),
        ParseEvent::UnknownField { key, value } => json!({"unknown_field": {key: value}}),
        ParseEvent::Solution(s) => json!({"solution": s}),
        other => json!({"other": format!("{other:?}")}),
    }
}

/// An error as JSON, for snapshots.
pub fn describe_error(e: &ParseError) -> Value {
    json!({
        "code": e.code(),
        "offset": e.offset,
        "call_index": e.call_index,
        "message": e.to_string(),
    })
}

/// The event log of `text` fed one byte at a time (`at` = bytes fed when each event came out),
/// after checking that other chunkings give the same events and the same end.
pub fn log(text: &str) -> Value {
    let bytes = text.as_bytes();
    let one = run_chunks(bytes, 1);
    for size in [2, 3, 5, 8, 13, bytes.len().max(1)] {
        let other = run_chunks(bytes, size);
        assert_eq!(events_of(&other), events_of(&one), "chunks of {size}");
        assert_eq!(other.1, one.1, "chunks of {size}");
    }
    let events: Vec<Value> = one
        .0
        .iter()
        .map(|(at, e)| {
            let mut v = describe(e);
            if let Some(m) = v.as_object_mut() {
                m.insert("at".into(), json!(at));
            }
            v
        })
        .collect();
    let end = match &one.1 {
        Ok(()) => json!("ok"),
        Err(e) => describe_error(e),
    };
    json!({"events": events, "end": end})
}

/// Strings full of what makes JSON scanning hard: quotes, backslashes, braces, non-ASCII.
pub fn tricky_string() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,8}",
        r#"[{}\[\]"\\:,/ a-z\t\n†é😀]{0,10}"#,
        Just("\\\"}{\\\\\"".to_string()),
    ]
}

/// Any JSON value, nested up to a few levels.
pub fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        tricky_string().prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map(tricky_string(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A valid call object, as the model would write it.
pub fn call_value() -> impl Strategy<Value = Value> {
    let key = r#"[a-zA-Z{}"\\ é😀][a-zA-Z0-9{}"\\ ]{0,5}"#;
    (
        r#"[a-zA-Z][a-zA-Z0-9_.{}"\\ ]{0,8}"#,
        prop::collection::btree_map(key, json_value(), 0..4),
        prop::option::of(r"†state\.[a-z]{1,5}( \|\| †state\.[a-z]{1,3})?"),
        prop::option::of(prop::sample::select(OutputMethod::ALL.to_vec())),
    )
        .prop_map(|(tool, params, path, method)| {
            let mut m = Map::new();
            m.insert("_tool".into(), tool.into());
            m.extend(params);
            if let Some(p) = path {
                m.insert("_outputPath".into(), p.into());
            }
            if let Some(meth) = method {
                m.insert("_outputMethod".into(), meth.as_str().into());
            }
            Value::Object(m)
        })
}

/// An element of `calls`: mostly valid calls, sometimes something the engine must reject.
pub fn call_element() -> impl Strategy<Value = Value> {
    prop_oneof![
        8 => call_value(),
        1 => json_value(),
        1 => call_value().prop_map(|mut v| {
            v["_outputMethod"] = json!("overwrite");
            v
        }),
    ]
}

/// How a solution object is laid out as text.
#[derive(Debug, Clone, Copy)]
pub enum Style {
    Compact,
    Pretty,
    /// Compact, with every non-ASCII character written as `\u` escapes.
    Ascii,
}

/// A solution object as text: its fields in any order, `calls` absent, null or an array.
pub fn solution_object(valid_only: bool) -> impl Strategy<Value = (Value, Style)> {
    let element = if valid_only {
        call_value().boxed()
    } else {
        call_element().boxed()
    };
    let calls = prop_oneof![
        1 => Just(None),
        1 => Just(Some(Value::Null)),
        6 => prop::collection::vec(element, 0..6).prop_map(|v| Some(Value::Array(v))),
    ];
    let fields = (
        calls,
        prop::option::of(json_value()),
        prop::option::of(tricky_string()),
        prop::option::of(json_value()),
        prop::collection::btree_map("x[a-z]{0,4}", json_value(), 0..2),
    );
    let style = prop_oneof![
        Just(Style::Compact),
        Just(Style::Pretty),
        Just(Style::Ascii)
    ];
    (fields, style).prop_flat_map(|((calls, output, thoughts, meta, extra), style)| {
        let mut members: Vec<(String, Value)> = Vec::new();
        let named = [("calls", calls), ("output", output), ("meta", meta)];
        for (k, v) in named {
            if let Some(v) = v {
                members.push((k.to_string(), v));
            }
        }
        if let Some(t) = thoughts {
            members.push(("thoughts".into(), t.into()));
        }
        members.extend(extra);
        (Just(members).prop_shuffle(), Just(style))
            .prop_map(|(m, style)| (Value::Object(m.into_iter().collect()), style))
    })
}

/// Renders a value in a style.
pub fn render(v: &Value, style: Style) -> String {
    match style {
        Style::Compact => v.to_string(),
        Style::Pretty => serde_json::to_string_pretty(v).unwrap_or_default(),
        Style::Ascii => {
            // Non-ASCII characters only occur inside strings, so escaping each one is valid.
            let mut out = String::new();
            for c in v.to_string().chars() {
                if c.is_ascii() {
                    out.push(c);
                } else {
                    for unit in c.encode_utf16(&mut [0; 2]) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
            }
            out
        }
    }
}

/// Prose, fences or nothing around the JSON.
pub fn wrapper() -> impl Strategy<Value = (&'static str, &'static str)> {
    prop::sample::select(vec![
        ("", ""),
        ("```json\n", "\n```\n"),
        (
            "Sure, here is the plan:\n",
            "\nLet me know {if} you need more.",
        ),
        ("Voilà ✓ — le plan :\n```\n", "\n```"),
        ("  \n", "\n{\"trailing\": \"ignored\"}"),
    ])
}

/// Byte positions at which to cut a text of `len` bytes.
pub fn cuts() -> impl Strategy<Value = (bool, Vec<prop::sample::Index>)> {
    (
        prop::bool::weighted(0.2),
        prop::collection::vec(any::<prop::sample::Index>(), 0..16),
    )
}

/// Turns generated cut points into positions for a text of `len` bytes.
pub fn positions(len: usize, (every_byte, picks): &(bool, Vec<prop::sample::Index>)) -> Vec<usize> {
    if *every_byte {
        return (1..len).collect();
    }
    picks.iter().map(|i| i.index(len + 1)).collect()
}

/// Concrete paths that overlap in every way rule 4 knows (equal, prefix, extension, an index
/// below a key), for plans whose calls read and write each other's paths, and two sibling
/// indexes: a write to `state.b[1]` pads `state.b[0]` with null, which wakes a reader of
/// `state.b[0]` (and below) at that write (spec/state.md S6a).
pub const CORE_PATHS: [&str; 9] = [
    "state.a",
    "state.a.b",
    "state.a.c",
    "state.a.b.d",
    "state.b",
    "state.b[0]",
    "state.b[0].x",
    "state.b[1]",
    "state.c",
];

/// A reference expression over [`CORE_PATHS`]: one path, or two joined by `||` or `&&`.
pub fn core_expression() -> impl Strategy<Value = String> {
    let path = prop::sample::select(CORE_PATHS.to_vec());
    (path.clone(), path, 0..4u8).prop_map(|(a, b, op)| match op {
        0 => format!("†{a} || †{b}"),
        1 => format!("†{a} && †{b}"),
        _ => format!("†{a}"),
    })
}

/// A call of tool `t` whose params hold up to three references (some nested in an array) and
/// whose output goes to one of [`CORE_PATHS`] (or two, as `||`), set or pushed; sometimes no
/// output path.
pub fn core_call() -> impl Strategy<Value = Value> {
    (
        prop::collection::vec(core_expression(), 0..3),
        prop::option::of(core_expression().prop_filter("no && target", |e| !e.contains("&&"))),
        any::<bool>(),
        any::<u8>(),
    )
        .prop_map(|(refs, target, push, k)| {
            let mut m = Map::new();
            m.insert("_tool".into(), "t".into());
            m.insert("k".into(), json!(k));
            for (i, r) in refs.into_iter().enumerate() {
                if i == 2 {
                    m.insert(format!("r{i}"), json!([r, k]));
                } else {
                    m.insert(format!("r{i}"), r.into());
                }
            }
            if let Some(t) = target {
                m.insert("_outputPath".into(), t.into());
                if push {
                    m.insert("_outputMethod".into(), "push".into());
                }
            }
            Value::Object(m)
        })
}

/// A plan for the core's property tests: up to ten calls, and the schedule of what happens
/// between them: each byte says whether the next input is the next call's arrival or the end of
/// a running call (which one, and whether it succeeds, failing to the `||` target's last branch).
pub fn core_plan() -> impl Strategy<Value = (Vec<Value>, Vec<u8>)> {
    (
        prop::collection::vec(core_call(), 1..10),
        prop::collection::vec(any::<u8>(), 0..40),
    )
}
