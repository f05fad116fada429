//! Composition of the Request schema and validation of outputs and params (spec/schema.md).

use dagloop::protocol::{Tool, json_type};
use dagloop::schema::{OutputValidator, ToolValidators, compose};
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

/// The tools of the main snapshot: an activity tool with `_output`, a latent tool, a tool with
/// a fixed `_outputPath`, one with a pattern `_outputPath`, and meta keys to strip.
fn sample_tools() -> Vec<Tool> {
    vec![
        tool(json!({
            "_tool": "issueRefund", "description": "Refunds an amount; returns {refundId}.",
            "_activity": "http", "_approval": "always",
            "_http": {"method": "POST", "url": "http://127.0.0.1:9000/refund"},
            "_output": {"type": "object", "properties": {"refundId": {"type": "string"}}},
            "type": "object",
            "properties": {"customerId": {"type": "string"}, "amount": {"type": "number", "minimum": 0}},
            "required": ["customerId", "amount"],
            "additionalProperties": false
        })),
        tool(json!({
            "_tool": "think", "description": "Think before acting.",
            "_output": {"type": "object", "properties": {"plan": {"type": "string"}}, "required": ["plan"]},
            "properties": {"topic": {"type": "string"}}
        })),
        tool(json!({
            "_tool": "summarise", "_activity": "rust",
            "_outputPath": {"type": "string", "const": "†state.summary"},
            "properties": {"text": {"type": "string"}}, "required": ["text"]
        })),
        tool(json!({
            "_tool": "store", "_activity": "rust", "_delegate": "x.json",
            "_outputPath": {"type": "string", "pattern": "^†state\\.cache\\."},
            "properties": {"value": true}
        })),
    ]
}

fn user_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"status": {"enum": ["refunded", "refused"]}, "amount": {"type": "number"}},
        "required": ["status"],
        "additionalProperties": false
    })
}

fn composed_validator(tools: &[Tool], output: &Value) -> OutputValidator {
    OutputValidator::new(&compose(tools, output).unwrap()).unwrap()
}

#[test]
fn composed_schema_snapshot() {
    insta::assert_json_snapshot!(compose(&sample_tools(), &user_schema()).unwrap());
}

#[test]
fn composed_schema_without_tools_allows_no_calls() {
    let composed = compose(&[], &user_schema()).unwrap();
    insta::assert_json_snapshot!(composed);
    let v = OutputValidator::new(&composed).unwrap();
    assert!(v.is_valid(&json!({"calls": [], "output": {"status": "refused"}})));
    assert!(!v.is_valid(&json!({"calls": [{"_tool": "x"}], "output": null})));
}

#[test]
fn top_level_shape() {
    let v = composed_validator(&sample_tools(), &user_schema());
    // `calls` and `output` are required; `thoughts` is optional; nothing else is allowed.
    assert!(v.is_valid(&json!({"calls": [], "output": null})));
    assert!(
        v.is_valid(&json!({"thoughts": "done", "calls": [], "output": {"status": "refunded"}}))
    );
    assert!(!v.is_valid(&json!({"output": null})));
    assert!(!v.is_valid(&json!({"calls": []})));
    assert!(!v.is_valid(&json!({"calls": [], "output": null, "meta": {}})));
    assert!(!v.is_valid(&json!({"thoughts": 3, "calls": [], "output": null})));
}

#[test]
fn output_is_the_user_schema_or_null() {
    let v = composed_validator(&sample_tools(), &user_schema());
    assert!(v.is_valid(&json!({"calls": [], "output": null})));
    assert!(v.is_valid(&json!({"calls": [], "output": {"status": "refused", "amount": 3}})));
    assert!(!v.is_valid(&json!({"calls": [], "output": {"status": "maybe"}})));
    assert!(!v.is_valid(&json!({"calls": [], "output": "refunded"})));
}

#[test]
fn calls_must_match_a_defined_tool() {
    let v = composed_validator(&sample_tools(), &user_schema());
    let call = |c: Value| json!({"calls": [c], "output": null});
    assert!(v.is_valid(&call(
        json!({"_tool": "issueRefund", "customerId": "c1", "amount": 5})
    )));
    assert!(!v.is_valid(&call(json!({"_tool": "nope"}))));
    assert!(!v.is_valid(&call(json!({"customerId": "c1", "amount": 5}))));
    // The tool's own rules still hold: required params, additionalProperties false, types.
    assert!(!v.is_valid(&call(json!({"_tool": "issueRefund", "customerId": "c1"}))));
    assert!(!v.is_valid(&call(
        json!({"_tool": "issueRefund", "customerId": "c1", "amount": 5, "x": 1})
    )));
    assert!(!v.is_valid(&call(
        json!({"_tool": "issueRefund", "customerId": "c1", "amount": -1})
    )));
}

#[test]
fn params_accept_reference_strings() {
    let v = composed_validator(&sample_tools(), &user_schema());
    let call = |c: Value| json!({"calls": [c], "output": null});
    for reference in ["†input.amount", "$ref:state.total", "†state.a || †state.b"] {
        assert!(
            v.is_valid(&call(
                json!({"_tool": "issueRefund", "customerId": "†input.id", "amount": reference})
            )),
            "{reference}"
        );
    }
    // A plain string is still not a number, and the pattern is anchored at the start: a
    // reference with leading blanks is not described (decoders should not emit them).
    for not_a_reference in ["fifty", "  †state.a", "x†state.a", "ref:state.a"] {
        assert!(
            !v.is_valid(&call(
                json!({"_tool": "issueRefund", "customerId": "c", "amount": not_a_reference})
            )),
            "{not_a_reference}"
        );
    }
}

#[test]
fn meta_fields_of_calls() {
    let v = composed_validator(&sample_tools(), &user_schema());
    let call = |c: Value| json!({"calls": [c], "output": null});
    let refund = |extra: Value| {
        let mut c = obj(json!({"_tool": "issueRefund", "customerId": "c", "amount": 1}));
        c.extend(obj(extra));
        call(Value::Object(c))
    };
    assert!(v.is_valid(&refund(
        json!({"_outputPath": "†state.refund", "_outputMethod": "push"})
    )));
    assert!(v.is_valid(&refund(
        json!({"_outputPath": "†state.ok || †state.failed"})
    )));
    assert!(!v.is_valid(&refund(json!({"_outputPath": "state.refund"}))));
    assert!(!v.is_valid(&refund(json!({"_outputMethod": "append"}))));
    // Activity-backed tools never get `_output`, even though this one declares it.
    assert!(!v.is_valid(&refund(json!({"_output": {"refundId": "r1"}}))));
}

#[test]
fn latent_tools_require_output() {
    let v = composed_validator(&sample_tools(), &user_schema());
    let call = |c: Value| json!({"calls": [c], "output": null});
    assert!(v.is_valid(&call(
        json!({"_tool": "think", "topic": "refunds", "_output": {"plan": "check"}})
    )));
    assert!(!v.is_valid(&call(json!({"_tool": "think", "topic": "refunds"}))));
    assert!(!v.is_valid(&call(json!({"_tool": "think", "_output": {"plan": 1}}))));
    // A latent tool without an `_output` schema still needs `_output`, of any shape.
    let bare = vec![Tool::new("note")];
    let v = composed_validator(&bare, &json!(true));
    assert!(v.is_valid(&call(json!({"_tool": "note", "_output": [1, 2]}))));
    assert!(!v.is_valid(&call(json!({"_tool": "note"}))));
}

#[test]
fn declared_output_paths() {
    let v = composed_validator(&sample_tools(), &user_schema());
    let call = |c: Value| json!({"calls": [c], "output": null});
    // A `const` output path is required and fixed.
    assert!(v.is_valid(&call(
        json!({"_tool": "summarise", "text": "t", "_outputPath": "†state.summary"})
    )));
    assert!(!v.is_valid(&call(json!({"_tool": "summarise", "text": "t"}))));
    assert!(!v.is_valid(&call(
        json!({"_tool": "summarise", "text": "t", "_outputPath": "†state.other"})
    )));
    // A pattern output path constrains without requiring.
    assert!(v.is_valid(&call(json!({"_tool": "store", "value": 1}))));
    assert!(v.is_valid(&call(
        json!({"_tool": "store", "value": 1, "_outputPath": "†state.cache.k"})
    )));
    assert!(!v.is_valid(&call(
        json!({"_tool": "store", "value": 1, "_outputPath": "†state.k"})
    )));
    // A plain string is shorthand for a const.
    let t = tool(json!({"_tool": "fixed", "_activity": "rust", "_outputPath": "†state.fixed"}));
    let composed = compose(&[t], &json!(true)).unwrap();
    let branch = &composed["properties"]["calls"]["items"]["anyOf"][0];
    assert_eq!(
        branch["properties"]["_outputPath"],
        json!({"type": "string", "const": "†state.fixed"})
    );
    assert_eq!(branch["required"], json!(["_tool", "_outputPath"]));
}

#[test]
fn declared_output_method() {
    let t = tool(
        json!({"_tool": "log", "_activity": "rust", "_outputPath": "†state.log", "_outputMethod": "push"}),
    );
    let composed = compose(&[t], &json!(true)).unwrap();
    let branch = &composed["properties"]["calls"]["items"]["anyOf"][0];
    assert_eq!(
        branch["properties"]["_outputMethod"],
        json!({"type": "string", "const": "push"})
    );
    assert_eq!(
        branch["required"],
        json!(["_tool", "_outputPath", "_outputMethod"])
    );
    let v = OutputValidator::new(&composed).unwrap();
    let call = |c: Value| json!({"calls": [c], "output": null});
    assert!(v.is_valid(&call(
        json!({"_tool": "log", "_outputPath": "†state.log", "_outputMethod": "push"})
    )));
    assert!(!v.is_valid(&call(
        json!({"_tool": "log", "_outputPath": "†state.log", "_outputMethod": "set"})
    )));
}

#[test]
fn meta_keys_never_reach_the_model() {
    let composed = compose(&sample_tools(), &user_schema()).unwrap();
    let allowed = ["_tool", "_outputPath", "_outputMethod", "_output"];
    for branch in composed["properties"]["calls"]["items"]["anyOf"]
        .as_array()
        .unwrap()
    {
        for key in branch.as_object().unwrap().keys() {
            assert!(!key.starts_with('_'), "meta key {key} left in {branch}");
        }
        for key in branch["properties"].as_object().unwrap().keys() {
            assert!(
                !key.starts_with('_') || allowed.contains(&key.as_str()),
                "{key}"
            );
        }
    }
}

#[test]
fn last_definition_of_a_name_wins_in_its_position() {
    let tools = vec![
        tool(json!({"_tool": "a", "description": "first a", "_activity": "rust"})),
        tool(json!({"_tool": "b", "_activity": "rust"})),
        tool(
            json!({"_tool": "a", "description": "second a", "_activity": "rust",
                    "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
        ),
        tool(json!({"_tool": "c", "_activity": "rust"})),
    ];
    let composed = compose(&tools, &json!(true)).unwrap();
    let branches = composed["properties"]["calls"]["items"]["anyOf"]
        .as_array()
        .unwrap();
    let names: Vec<&Value> = branches
        .iter()
        .map(|b| &b["properties"]["_tool"]["const"])
        .collect();
    assert_eq!(names, [&json!("b"), &json!("a"), &json!("c")]);
    insta::assert_json_snapshot!(branches);
    // The params validators agree: the first `a` is gone.
    let validators = ToolValidators::new(&tools).unwrap();
    assert_eq!(validators.names().collect::<Vec<_>>(), ["a", "b", "c"]);
    assert_eq!(
        validators.validate("a", &Default::default()).unwrap().len(),
        1
    );
}

#[test]
fn an_overridden_definition_is_not_compiled() {
    let tools = vec![
        tool(json!({"_tool": "a", "properties": {"n": {"type": "nonsense"}}})),
        tool(json!({"_tool": "a", "properties": {"n": {"type": "integer"}}})),
    ];
    assert!(compose(&tools, &json!(true)).is_ok());
    assert!(ToolValidators::new(&tools).is_ok());
}

#[test]
fn additional_and_pattern_properties_accept_references() {
    let t = tool(json!({
        "_tool": "kv", "_activity": "rust",
        "properties": {"_instance": {"type": "string"}},
        "patternProperties": {"^n_": {"type": "number"}},
        "additionalProperties": {"type": "boolean"}
    }));
    let composed = compose(&[t], &json!(true)).unwrap();
    let branch = &composed["properties"]["calls"]["items"]["anyOf"][0];
    insta::assert_json_snapshot!(branch);
    let v = OutputValidator::new(&composed).unwrap();
    let call = |c: Value| json!({"calls": [c], "output": null});
    assert!(v.is_valid(&call(
        json!({"_tool": "kv", "n_1": 1, "n_2": "†state.n", "flag": "$ref:state.f"})
    )));
    assert!(!v.is_valid(&call(json!({"_tool": "kv", "n_1": "one"}))));
    assert!(!v.is_valid(&call(json!({"_tool": "kv", "flag": 1}))));
    // `_`-prefixed properties the tool declares are kept as they are (no reference allowed).
    assert!(!v.is_valid(&call(json!({"_tool": "kv", "_instance": 3}))));
}

#[test]
fn local_references_keep_working_after_composition() {
    // Both the output schema and a tool use `$defs` with the same name, plus recursion.
    let output = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$defs": {
            "Node": {"type": "object", "properties": {"name": {"type": "string"},
                     "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
                     "required": ["name"]},
            "Unused": {"type": "null"}
        },
        "type": "object",
        "properties": {"root": {"$ref": "#/$defs/Node"}, "again": {"$ref": "#/properties/root"}},
        "required": ["root"]
    });
    let t = tool(json!({
        "_tool": "find", "_activity": "rust",
        "$defs": {"Node": {"type": "string", "minLength": 1}},
        "properties": {"query": {"$ref": "#/$defs/Node"}}, "required": ["query"]
    }));
    let composed = compose(&[t], &output).unwrap();
    insta::assert_json_snapshot!(composed);
    let v = OutputValidator::new(&composed).unwrap();
    let good = json!({"calls": [{"_tool": "find", "query": "x"}],
                      "output": {"root": {"name": "a", "children": [{"name": "b"}]}, "again": {"name": "c"}}});
    assert_eq!(v.validate(&good), vec![]);
    let deep_bad =
        json!({"calls": [], "output": {"root": {"name": "a", "children": [{"children": []}]}}});
    assert!(!v.is_valid(&deep_bad));
    let tool_bad = json!({"calls": [{"_tool": "find", "query": ""}], "output": null});
    assert!(!v.is_valid(&tool_bad));
}

#[test]
fn recursive_root_reference_and_percent_encoded_names() {
    let output = json!({
        "$defs": {"My Type": {"type": "integer"}},
        "type": "object",
        "properties": {"n": {"$ref": "#/$defs/My%20Type"}, "next": {"$ref": "#"}}
    });
    let composed = compose(&[], &output).unwrap();
    assert_eq!(
        composed["$defs"]["output.My_Type"],
        json!({"type": "integer"})
    );
    let v = OutputValidator::new(&composed).unwrap();
    assert!(v.is_valid(&json!({"calls": [], "output": {"n": 1, "next": {"n": 2, "next": {}}}})));
    assert!(!v.is_valid(&json!({"calls": [], "output": {"n": 1, "next": {"next": {"n": "x"}}}})));
}

#[test]
fn schemas_with_their_own_id_are_embedded_untouched() {
    let output = json!({
        "$id": "https://example.com/out.json",
        "$defs": {"n": {"type": "integer"}},
        "properties": {"n": {"$ref": "#/$defs/n"}}
    });
    let composed = compose(&[], &output).unwrap();
    assert_eq!(composed["properties"]["output"]["anyOf"][0], output);
    assert!(composed.get("$defs").is_none());
    let v = OutputValidator::new(&composed).unwrap();
    assert!(!v.is_valid(&json!({"calls": [], "output": {"n": "x"}})));
}

#[test]
fn composition_is_deterministic() {
    let a = serde_json::to_string(&compose(&sample_tools(), &user_schema()).unwrap()).unwrap();
    let b = serde_json::to_string(&compose(&sample_tools(), &user_schema()).unwrap()).unwrap();
    assert_eq!(a, b);
}
