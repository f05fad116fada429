//! Composition on bad and hostile input: typed errors, never a panic (spec/schema.md, E rules).

use dagloop::protocol::{Tool, json_type};
use dagloop::schema::{OutputValidator, SchemaError, Subject, compose};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

fn tool(v: Value) -> Tool {
    Tool::from_value(v).unwrap()
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        other => panic!("expected an object, found {}", json_type(&other)),
    }
}

#[test]
fn invalid_parts_are_typed_errors() {
    let ok_tool = || tool(json!({"_tool": "ok", "_activity": "rust"}));
    let cases: Vec<(&str, Vec<Tool>, Value)> = vec![
        (
            "output schema not a schema",
            vec![],
            json!({"type": "strng"}),
        ),
        ("output schema null", vec![], Value::Null),
        (
            "output schema bad regex",
            vec![],
            json!({"properties": {"a": {"pattern": "(("}}}),
        ),
        (
            "output schema dangling ref",
            vec![],
            json!({"$ref": "#/$defs/missing"}),
        ),
        (
            "output schema remote ref",
            vec![],
            json!({"$ref": "https://example.com/s.json"}),
        ),
        (
            "output schema unknown dialect",
            vec![],
            json!({"$schema": "https://example.com/meta"}),
        ),
        (
            "tool properties not an object",
            vec![tool(json!({"_tool": "t", "properties": 5}))],
            json!(true),
        ),
        (
            "tool required not an array",
            vec![tool(json!({"_tool": "t", "required": "a"}))],
            json!(true),
        ),
        (
            "tool of type string",
            vec![tool(json!({"_tool": "t", "type": "string"}))],
            json!(true),
        ),
        (
            "tool of types without object",
            vec![tool(json!({"_tool": "t", "type": ["array", "null"]}))],
            json!(true),
        ),
        (
            "latent tool with invalid _output",
            vec![tool(json!({"_tool": "t", "_output": {"minimum": "0"}}))],
            json!(true),
        ),
        (
            "tool with dangling ref",
            vec![tool(
                json!({"_tool": "t", "properties": {"a": {"$ref": "#/$defs/x"}}}),
            )],
            json!(true),
        ),
        (
            "tool ref into a meta key",
            // Read as stored (serde): `Tool::from_value` refuses the unknown meta key itself.
            vec![
                serde_json::from_value(
                    json!({"_tool": "t", "_x": {}, "properties": {"a": {"$ref": "#/_x"}}}),
                )
                .unwrap(),
            ],
            json!(true),
        ),
        (
            "output path of the wrong type",
            vec![tool(json!({"_tool": "t", "_outputPath": 5}))],
            json!(true),
        ),
        (
            "output path not a reference",
            vec![tool(json!({"_tool": "t", "_outputPath": "state.x"}))],
            json!(true),
        ),
        (
            "output path const with a wildcard",
            vec![tool(
                json!({"_tool": "t", "_outputPath": {"const": "†state.x[*]"}}),
            )],
            json!(true),
        ),
        (
            "output path schema invalid",
            vec![tool(json!({"_tool": "t", "_outputPath": {"type": "text"}}))],
            json!(true),
        ),
        (
            "unknown fixed output method",
            vec![tool(json!({"_tool": "t", "_outputMethod": "append"}))],
            json!(true),
        ),
        (
            "empty tool name",
            vec![ok_tool(), Tool::new("")],
            json!(true),
        ),
        ("blank tool name", vec![Tool::new(" \t")], json!(true)),
        (
            "tool name with a newline",
            vec![Tool::new("a\nb")],
            json!(true),
        ),
    ];
    let mut report = String::new();
    for (what, tools, output) in cases {
        let err = compose(&tools, &output).expect_err(what);
        report.push_str(&format!("{what}\n  {}\n  {err}\n", err.code()));
    }
    insta::assert_snapshot!(report);
}

#[test]
fn errors_name_their_subject_and_pointer() {
    let err = compose(&[], &json!({"properties": {"a": {"type": "strng"}}})).unwrap_err();
    match err {
        SchemaError::InvalidSchema {
            subject, pointer, ..
        } => {
            assert_eq!(subject, Subject::OutputSchema);
            assert_eq!(pointer, "/properties/a/type");
        }
        other => panic!("{other:?}"),
    }
    let t = tool(json!({"_tool": "t", "_output": {"items": {"minItems": -1}}}));
    match compose(&[t], &json!(true)).unwrap_err() {
        SchemaError::InvalidSchema {
            subject, pointer, ..
        } => {
            assert_eq!(subject, Subject::ToolOutput("t".into()));
            assert_eq!(pointer, "/items/minItems");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn hostile_tool_names_compose_and_match_exactly() {
    let names = [
        "with space",
        "quote\"s",
        "slash/and~tilde",
        "#/$defs/x",
        "$ref",
        "†state.x",
        "ünïcödé 工具",
        "a.b",
        "a_b",
        "a-b",
        "-",
        "x".repeat(300).leak(),
    ];
    let tools: Vec<Tool> = names
        .iter()
        .map(|n| {
            tool(
                json!({"_tool": n, "_activity": "rust", "$defs": {"D": {"type": "integer"}},
                        "properties": {"p": {"$ref": "#/$defs/D"}}}),
            )
        })
        .collect();
    let composed = compose(&tools, &json!(true)).unwrap();
    let v = OutputValidator::new(&composed).unwrap();
    for n in names {
        assert!(
            v.is_valid(&json!({"calls": [{"_tool": n, "p": 1}], "output": null})),
            "{n}"
        );
        assert!(
            !v.is_valid(&json!({"calls": [{"_tool": n, "p": "one"}], "output": null})),
            "{n}"
        );
    }
    // Sanitized names collide (a.b, a_b, a-b, ...) and still get distinct definitions.
    assert_eq!(composed["$defs"].as_object().unwrap().len(), names.len());
}

#[test]
fn composing_arbitrary_values_never_panics() {
    let values = [
        json!(1),
        json!("schema"),
        json!([]),
        json!({"anyOf": []}),
        json!({"$ref": 5}),
        json!({"$ref": "#/%zz"}),
        json!({"$ref": "#foo"}),
        json!({"$defs": 5}),
        json!({"properties": {"$ref": {"type": "string"}}}),
        json!({"const": {"$ref": "#/nope"}}),
        json!({"$id": 5}),
        json!({"$schema": 5}),
        json!({"type": []}),
        json!(false),
    ];
    for v in values {
        match compose(&[], &v) {
            Ok(c) => assert!(OutputValidator::new(&c).is_ok(), "{v}"),
            Err(e) => assert_eq!(e.code(), "schema.invalid_schema", "{v}: {e}"),
        }
        let t = Tool {
            schema: obj(json!({"properties": {"x": v.clone()}})),
            ..Tool::new("t")
        };
        match compose(&[t], &json!(true)) {
            Ok(c) => assert!(OutputValidator::new(&c).is_ok(), "{v}"),
            Err(e) => assert!(e.code().starts_with("schema."), "{v}: {e}"),
        }
    }
}

/// JSON values shaped like schemas, with keywords that exercise composition.
fn arb_schemaish() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-3i64..3).prop_map(Value::from),
        prop::sample::select(vec![
            "object",
            "string",
            "#",
            "#/$defs/a",
            "#/properties/x",
            "#/%41",
            "†state.x",
            ""
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop::sample::select(vec![
                    "type",
                    "properties",
                    "items",
                    "$ref",
                    "$defs",
                    "a",
                    "x",
                    "anyOf",
                    "required",
                    "const",
                    "additionalProperties",
                    "_output",
                    "$id",
                    "pattern",
                ]),
                inner,
                0..5,
            )
            .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
        ]
    })
}

/// Reference for "last definition wins, in the position of the last definition".
fn reference_order(names: &[&str]) -> Vec<(String, usize)> {
    let mut kept: Vec<(String, usize)> = Vec::new();
    for (i, n) in names.iter().enumerate().rev() {
        if !kept.iter().any(|(k, _)| k == n) {
            kept.push((n.to_string(), i));
        }
    }
    kept.reverse();
    kept
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn composing_schema_like_values_never_panics(v in arb_schemaish()) {
        match compose(&[], &v) {
            Ok(c) => prop_assert!(OutputValidator::new(&c).is_ok()),
            Err(e) => prop_assert_eq!(e.code(), "schema.invalid_schema"),
        }
        let as_tool = match &v {
            Value::Object(m) => Tool { schema: m.clone(), ..Tool::new("t") },
            _ => Tool { schema: obj(json!({"properties": {"p": v.clone()}})), ..Tool::new("t") },
        };
        match compose(&[as_tool], &json!(true)) {
            Ok(c) => prop_assert!(OutputValidator::new(&c).is_ok()),
            Err(e) => prop_assert!(e.code().starts_with("schema."), "{}", e),
        }
    }

    #[test]
    fn last_definition_wins_like_the_reference(picks in prop::collection::vec(0usize..4, 0..12)) {
        let names: Vec<&str> = picks.iter().map(|i| ["a", "b", "c", "d"][*i]).collect();
        let tools: Vec<Tool> = names
            .iter()
            .enumerate()
            .map(|(i, n)| tool(json!({"_tool": n, "description": format!("definition {i}"), "_activity": "rust"})))
            .collect();
        let composed = compose(&tools, &json!(true)).unwrap();
        let got: Vec<(String, usize)> = composed["properties"]["calls"]["items"]["anyOf"]
            .as_array()
            .map(|a| a.as_slice())
            .unwrap_or_default()
            .iter()
            .map(|b| {
                let name = b["properties"]["_tool"]["const"].as_str().unwrap().to_string();
                let i = b["description"].as_str().unwrap()["definition ".len()..].parse().unwrap();
                (name, i)
            })
            .collect();
        prop_assert_eq!(got, reference_order(&names));
    }

    #[test]
    fn any_usable_name_composes_and_matches_only_itself(name in any::<String>()) {
        let usable = !name.trim().is_empty() && !name.chars().any(char::is_control);
        match compose(&[Tool::new(name.clone())], &json!(true)) {
            Err(e) => {
                prop_assert!(!usable, "{} refused: {}", name, e);
                prop_assert_eq!(e.code(), "schema.invalid_tool_name");
            }
            Ok(c) => {
                prop_assert!(usable, "{:?} accepted", name);
                let v = OutputValidator::new(&c).unwrap();
                let own = json!({"calls": [{"_tool": name, "_output": 1}], "output": null});
                prop_assert!(v.is_valid(&own), "{:?} rejected", name);
                let other = json!({"calls": [{"_tool": format!("{name}x"), "_output": 1}], "output": null});
                prop_assert!(!v.is_valid(&other), "{:?}x accepted", name);
            }
        }
    }
}
