//! References, paths and expressions: parsing, printing and bad input.

use dagloop::protocol::{Combinator, Path, Segment, parse_expression};

fn one(text: &str) -> dagloop::protocol::Expression {
    parse_expression(text).unwrap().expect("a reference")
}

#[test]
fn plain_reference_parses_kind_keys_and_indices() {
    let e = one("†state.users[0].id");
    assert_eq!(e.op, Combinator::Single);
    assert_eq!(
        e.refs[0].path,
        Path::new(
            "state",
            [
                Segment::Key("users".into()),
                Segment::Index(0),
                Segment::Key("id".into())
            ]
        )
    );
    assert_eq!(e.refs[0].query, None);
    assert_eq!(e.to_string(), "†state.users[0].id");
}

#[test]
fn ascii_alias_is_equivalent_to_the_dagger() {
    assert_eq!(one("$ref:input.amount"), one("†input.amount"));
}

#[test]
fn quoted_keys_allow_any_text() {
    let e = one(r#"†state["a b"]['c.d']"#);
    assert_eq!(
        e.refs[0].path,
        Path::new(
            "state",
            [Segment::Key("a b".into()), Segment::Key("c.d".into())]
        )
    );
    assert_eq!(e.to_string(), r#"†state["a b"]["c.d"]"#);
}

#[test]
fn wildcards_and_filters_become_a_jsonpath_tail() {
    let e = one("†input.items[*].price");
    assert_eq!(
        e.refs[0].path,
        Path::new("input", [Segment::Key("items".into())])
    );
    assert_eq!(e.refs[0].query.as_deref(), Some("$[*].price"));
    let f = one("†state.orders[?@.active].id");
    assert_eq!(f.refs[0].query.as_deref(), Some("$[?@.active].id"));
}

#[test]
fn or_and_and_expressions() {
    let e = one("†state.a || †state.b || $ref:input.c");
    assert_eq!(e.op, Combinator::Or);
    assert_eq!(e.refs.len(), 3);
    let e = one("†state.a&&†state.b");
    assert_eq!(e.op, Combinator::And);
    assert_eq!(e.to_string(), "†state.a && †state.b");
}

#[test]
fn operators_inside_quotes_and_filters_do_not_split() {
    let e = one(r#"†state["x||y"]"#);
    assert_eq!(e.refs.len(), 1);
    let e = one("†state.items[?@.a && @.b].id || †state.other");
    assert_eq!(e.op, Combinator::Or);
    assert_eq!(e.refs.len(), 2);
}

#[test]
fn plain_strings_are_not_references() {
    for s in [
        "hello",
        "cost: $5",
        "a † in the middle",
        "",
        "@state.x",
        "ref:state",
    ] {
        assert_eq!(parse_expression(s).unwrap(), None, "{s:?}");
    }
}

#[test]
fn path_overlap_is_prefix_or_extension() {
    let ab = Path::parse("state.a.b").unwrap();
    let a = Path::parse("state.a").unwrap();
    let abc = Path::parse("state.a.b.c").unwrap();
    let ac = Path::parse("state.a.c").unwrap();
    let input_a = Path::parse("input.a").unwrap();
    assert!(ab.overlaps(&a) && ab.overlaps(&abc) && ab.overlaps(&ab));
    assert!(!ab.overlaps(&ac));
    assert!(!a.overlaps(&input_a));
}

#[test]
fn paths_round_trip_through_serde_as_strings() {
    let p = Path::parse("state.users[3].name").unwrap();
    let v = serde_json::to_value(&p).unwrap();
    assert_eq!(v, serde_json::json!("state.users[3].name"));
    let back: Path = serde_json::from_value(v).unwrap();
    assert_eq!(back, p);
}

#[test]
fn malformed_references_give_text_and_position() {
    let cases = [
        "†",
        "†.state",
        "†9lives",
        "†state.",
        "†state..a[",
        "†state.a[",
        "†state.a[]",
        "†state.a[x]",
        "†state.a ||",
        "†state.a || †state.b && †state.c",
        "†state.a || state.b",
        "†state.a b",
        "†state.a[\"unterminated]",
    ];
    let mut out = String::new();
    for c in cases {
        match parse_expression(c) {
            Err(e) => out.push_str(&format!("{c:?} -> {e}\n")),
            Ok(v) => panic!("{c:?} parsed as {v:?}"),
        }
    }
    insta::assert_snapshot!(out);
}
