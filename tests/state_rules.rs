//! Protocol rules 1-4 and 6 on the state log (see spec/state.md).

use dagloop::protocol::{Call, CallId, OutputMethod, Path, parse_expression};
use dagloop::state::{Eval, Resolved, State, output_paths};
use serde_json::{Value, json};

fn p(s: &str) -> Path {
    Path::parse(s).unwrap()
}

fn nothing_pending(_: &Path) -> bool {
    false
}

fn set(state: &mut State, path: &str, v: Value) {
    let at = state.len() as u64;
    state.write(p(path), v, OutputMethod::Set, None, at);
}

#[test]
fn rule1_whole_reference_is_replaced_by_any_json_type() {
    let mut s = State::new();
    set(
        &mut s,
        "input",
        json!({"n": 3, "tags": ["x"], "user": {"id": "u1"}}),
    );
    let call: Call = serde_json::from_value(json!({
        "_tool": "t",
        "count": "†input.n",
        "tags": "†input.tags",
        "nested": {"deep": ["†input.user.id", "literal"]},
        "sentence": "keep † as text"
    }))
    .unwrap();
    let Resolved::Ready(params) = s.resolve_params(&call.params, &nothing_pending).unwrap() else {
        panic!("not ready")
    };
    assert_eq!(
        Value::Object(params),
        json!({"count": 3, "tags": ["x"], "nested": {"deep": ["u1", "literal"]}, "sentence": "keep † as text"})
    );
}

#[test]
fn rule2_set_is_last_write_wins() {
    let mut s = State::new();
    set(&mut s, "state.x", json!(1));
    set(&mut s, "state.x", json!(2));
    assert_eq!(s.get(&p("state.x")), Some(json!(2)));
    assert_eq!(
        s.log().len(),
        2,
        "writes are appended, never merged in place"
    );
}

#[test]
fn rule2_merge_methods_collect_back_to_the_nearest_set() {
    let mut s = State::new();
    s.write(
        p("state.u"),
        json!({"a": {"x": 1}}),
        OutputMethod::Set,
        None,
        0,
    );
    s.write(
        p("state.u"),
        json!({"a": {"y": 2}}),
        OutputMethod::Merge,
        None,
        1,
    );
    assert_eq!(s.get(&p("state.u")), Some(json!({"a": {"x": 1, "y": 2}})));
    s.write(
        p("state.u"),
        json!({"a": {"z": 3}}),
        OutputMethod::Assign,
        None,
        2,
    );
    assert_eq!(s.get(&p("state.u")), Some(json!({"a": {"z": 3}})));
    s.write(p("state.list"), json!([1]), OutputMethod::Set, None, 3);
    s.write(p("state.list"), json!(2), OutputMethod::Push, None, 4);
    s.write(
        p("state.list"),
        json!([3, 4]),
        OutputMethod::Concat,
        None,
        5,
    );
    assert_eq!(s.get(&p("state.list")), Some(json!([1, 2, 3, 4])));
    s.write(
        p("state.list"),
        json!(["reset"]),
        OutputMethod::Set,
        None,
        6,
    );
    s.write(p("state.list"), json!("after"), OutputMethod::Push, None, 7);
    assert_eq!(s.get(&p("state.list")), Some(json!(["reset", "after"])));
}

#[test]
fn rule3_each_write_records_its_call_and_time_in_completion_order() {
    let mut s = State::new();
    s.write(
        p("state.x"),
        json!("slow"),
        OutputMethod::Set,
        Some(CallId(2)),
        50,
    );
    s.write(
        p("state.x"),
        json!("fast"),
        OutputMethod::Set,
        Some(CallId(1)),
        10,
    );
    // The caller appends in completion order; the order of appends decides, not the timestamp.
    assert_eq!(s.get(&p("state.x")), Some(json!("fast")));
    let w = &s.log()[0];
    assert_eq!((w.call, w.at, w.seq), (Some(CallId(2)), 50, 0));
}

#[test]
fn rule4_reads_see_prefix_and_extension_writes() {
    let mut s = State::new();
    set(&mut s, "state.a", json!({"b": {"c": 1}, "other": true}));
    set(&mut s, "state.a.b.d", json!(2));
    assert_eq!(s.get(&p("state.a.b")), Some(json!({"c": 1, "d": 2})));
    assert_eq!(s.get(&p("state.a.b.c")), Some(json!(1)));
    set(&mut s, "state.a", json!({"fresh": 1}));
    assert_eq!(s.get(&p("state.a.b")), None);
    assert_eq!(s.view("state"), Some(json!({"a": {"fresh": 1}})));
}

#[test]
fn absent_and_null_differ() {
    let mut s = State::new();
    set(&mut s, "state.n", Value::Null);
    assert_eq!(s.get(&p("state.n")), Some(Value::Null));
    assert_eq!(s.get(&p("state.m")), None);
}

#[test]
fn rule6_or_takes_the_first_alternative_that_resolves() {
    let mut s = State::new();
    set(&mut s, "state.b", json!("B"));
    let e = parse_expression("†state.a || †state.b").unwrap().unwrap();
    assert_eq!(
        s.eval(&e, &nothing_pending).unwrap(),
        Eval::Ready(json!("B"))
    );
    // While a pending call can still write `state.a`, the choice is not made yet.
    let a_pending = |q: &Path| q.overlaps(&p("state.a"));
    assert_eq!(
        s.eval(&e, &a_pending).unwrap(),
        Eval::Blocked(vec![p("state.a")])
    );
    set(&mut s, "state.a", json!("A"));
    assert_eq!(
        s.eval(&e, &nothing_pending).unwrap(),
        Eval::Ready(json!("A"))
    );
}

#[test]
fn rule6_and_needs_every_reference_and_yields_the_last() {
    let mut s = State::new();
    set(&mut s, "state.a", json!(1));
    let e = parse_expression("†state.a && †state.b").unwrap().unwrap();
    assert_eq!(
        s.eval(&e, &nothing_pending).unwrap(),
        Eval::Missing(vec![p("state.b")])
    );
    set(&mut s, "state.b", json!(2));
    assert_eq!(s.eval(&e, &nothing_pending).unwrap(), Eval::Ready(json!(2)));
}

#[test]
fn resolve_params_reports_blocked_and_missing_paths() {
    let s = State::new();
    let call: Call =
        serde_json::from_value(json!({"_tool": "t", "a": "†state.a", "b": "†state.b"})).unwrap();
    let a_pending = |q: &Path| q.overlaps(&p("state.a"));
    assert_eq!(
        s.resolve_params(&call.params, &a_pending).unwrap(),
        Resolved::Missing {
            missing: vec![p("state.b")],
            blocked: vec![p("state.a")]
        }
    );
}

#[test]
fn query_tails_use_jsonpath_over_the_resolved_value() {
    let mut s = State::new();
    set(
        &mut s,
        "input.items",
        json!([{"price": 1, "ok": true}, {"price": 2}, {"price": 3, "ok": true}]),
    );
    let e = parse_expression("†input.items[*].price").unwrap().unwrap();
    assert_eq!(
        s.eval(&e, &nothing_pending).unwrap(),
        Eval::Ready(json!([1, 2, 3]))
    );
    let e = parse_expression("†input.items[?@.ok].price")
        .unwrap()
        .unwrap();
    assert_eq!(
        s.eval(&e, &nothing_pending).unwrap(),
        Eval::Ready(json!([1, 3]))
    );
}

#[test]
fn rule10_output_paths_for_branches_and_fan_out() {
    let or = parse_expression("†state.ok || †state.err")
        .unwrap()
        .unwrap();
    assert_eq!(output_paths(&or, true, None), vec![p("state.ok")]);
    assert_eq!(output_paths(&or, false, None), vec![p("state.err")]);
    assert_eq!(output_paths(&or, true, Some(1)), vec![p("state.err")]);
    let and = parse_expression("†state.x && †state.audit.x")
        .unwrap()
        .unwrap();
    assert_eq!(
        output_paths(&and, true, None),
        vec![p("state.x"), p("state.audit.x")]
    );
    assert!(output_paths(&and, false, None).is_empty());
    let single = parse_expression("†state.x").unwrap().unwrap();
    assert!(output_paths(&single, false, None).is_empty());
}

#[test]
fn bad_input_gets_typed_errors() {
    let mut out = String::new();
    for v in [
        json!("not an object"),
        json!({"x": 1}),
        json!({"_tool": ""}),
        json!({"_tool": "t", "_outputMethod": "append"}),
        json!({"_tool": "t", "_outputPath": 5}),
        json!({"_tool": "t", "_scopes": "state"}),
    ] {
        let e = Call::try_from(v.clone()).unwrap_err();
        out.push_str(&format!("{v} -> [{}] {e}\n", e.code()));
    }
    let bad_path: Call =
        serde_json::from_value(json!({"_tool": "t", "_outputPath": "state.x"})).unwrap();
    out.push_str(&format!(
        "output path `state.x` -> {}\n",
        bad_path.output_target().unwrap_err()
    ));
    let wild: Call =
        serde_json::from_value(json!({"_tool": "t", "_outputPath": "†state.x[*]"})).unwrap();
    out.push_str(&format!(
        "output path with wildcard -> {}\n",
        wild.output_target().unwrap_err()
    ));
    let s = State::new();
    let broken: Call =
        serde_json::from_value(json!({"_tool": "t", "a": {"b": "†state.x["}})).unwrap();
    let e = s
        .resolve_params(&broken.params, &nothing_pending)
        .unwrap_err();
    out.push_str(&format!(
        "nested malformed reference -> [{}] {e}\n",
        e.code()
    ));
    insta::assert_snapshot!(out);
}

#[test]
fn unknown_fields_are_kept() {
    // A stored call reads back as it was written, an unknown meta key included...
    let v = json!({"_tool": "t", "x": 1, "_custom": {"k": true}, "_outputPath": "†state.y"});
    let c: Call = serde_json::from_value(v.clone()).unwrap();
    assert_eq!(c.to_value(), v);
    // ...but input refuses a meta key dagloop does not define (issue 23: a typo fails closed).
    let e = Call::parse(v.clone()).unwrap_err();
    assert_eq!(e.code(), "protocol.unknown_meta_key");
    let e =
        dagloop::protocol::Solution::from_value(json!({"calls": [v], "output": null})).unwrap_err();
    assert_eq!(e.code(), "protocol.unknown_meta_key");
    // Unknown fields that are not meta keys are kept: params of calls, extras of solutions.
    let v = json!({"_tool": "t", "x": 1, "custom": {"k": true}, "_outputPath": "†state.y"});
    assert_eq!(Call::parse(v.clone()).unwrap().to_value(), v);
    let sol =
        dagloop::protocol::Solution::from_value(json!({"calls": [v], "output": null, "extra": 1}))
            .unwrap();
    assert_eq!(sol.extra.get("extra"), Some(&json!(1)));
}

/// `get_from` names the calls whose writes a value was made of: the writes a read replays
/// (from the newest `set` covering the path), also when the read widens to a prefix (an
/// array grown by `push`); the goal's own data has no call.
#[test]
fn a_read_names_the_calls_whose_writes_it_was_made_of() {
    let mut s = State::new();
    let write = |s: &mut State, path: &str, v: Value, m: OutputMethod, by: Option<u64>| {
        let at = s.len() as u64;
        s.write(p(path), v, m, by.map(CallId), at);
    };
    write(&mut s, "input", json!({"q": "x"}), OutputMethod::Set, None);
    write(
        &mut s,
        "state.a",
        json!({"x": 1}),
        OutputMethod::Set,
        Some(1),
    );
    write(
        &mut s,
        "state.a",
        json!({"y": 2}),
        OutputMethod::Merge,
        Some(2),
    );
    write(&mut s, "state.b", json!(0), OutputMethod::Set, Some(3));
    let read = |s: &State, path: &str| {
        let mut by = Vec::new();
        let v = s.get_from(&p(path), &mut by);
        by.sort_unstable();
        by.dedup();
        (v, by)
    };
    assert_eq!(
        read(&s, "state.a"),
        (Some(json!({"x": 1, "y": 2})), vec![CallId(1), CallId(2)])
    );
    assert_eq!(read(&s, "input.q"), (Some(json!("x")), vec![]));
    assert_eq!(read(&s, "state.nothing"), (None, vec![]));
    write(
        &mut s,
        "state.a",
        json!({"z": 3}),
        OutputMethod::Set,
        Some(4),
    );
    assert_eq!(read(&s, "state.a.z"), (Some(json!(3)), vec![CallId(4)]));
    write(&mut s, "state.list", json!([1]), OutputMethod::Set, Some(5));
    write(&mut s, "state.list", json!(2), OutputMethod::Push, Some(6));
    assert_eq!(
        read(&s, "state.list[1]"),
        (Some(json!(2)), vec![CallId(5), CallId(6)])
    );
    assert_eq!(s.get(&p("state.list[1]")), Some(json!(2)));
}
