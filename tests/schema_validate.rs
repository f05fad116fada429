//! Validation of final outputs and call params (spec/schema.md, rules V1-V9).

use dagloop::protocol::{Params, Tool, json_type};
use dagloop::schema::{
    MAX_MESSAGE_CHARS, OutputValidator, ParamsValidator, SchemaError, Subject, ToolValidators,
    Violation, validate_params,
};
use serde_json::{Value, json};

fn obj(v: Value) -> Params {
    match v {
        Value::Object(m) => m.into(),
        other => panic!("expected an object, found {}", json_type(&other)),
    }
}

fn order_schema() -> Value {
    json!({
        "type": "object",
        "required": ["id", "customer", "lines", "status"],
        "additionalProperties": false,
        "properties": {
            "id": {"type": "string", "pattern": "^ord_[0-9]+$"},
            "customer": {
                "type": "object",
                "required": ["email"],
                "properties": {"email": {"type": "string", "format": "email"}, "vip": {"type": "boolean"}}
            },
            "lines": {
                "type": "array", "minItems": 1,
                "items": {"type": "object", "required": ["sku", "qty"],
                          "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}}}
            },
            "status": {"enum": ["open", "paid", "refunded"]},
            "note": {"anyOf": [{"type": "string", "maxLength": 10}, {"type": "null"}]}
        }
    })
}

#[test]
fn valid_output_has_no_violations() {
    let v = OutputValidator::new(&order_schema()).unwrap();
    let good = json!({"id": "ord_1", "customer": {"email": "a@example.com"},
                      "lines": [{"sku": "x", "qty": 2}], "status": "paid", "note": null});
    assert_eq!(v.validate(&good), Vec::<Violation>::new());
    assert!(v.is_valid(&good));
}

#[test]
fn every_output_violation_is_reported_with_its_pointer() {
    let v = OutputValidator::new(&order_schema()).unwrap();
    let bad = json!({
        "id": "order-1",
        "customer": {"email": "not an email", "vip": "yes"},
        "lines": [{"sku": "x", "qty": 0}, {"qty": 1.5}, "line"],
        "status": "lost",
        "note": "far too long for the limit",
        "extra": true
    });
    let violations = v.validate(&bad);
    assert!(!v.is_valid(&bad));
    let mut sorted = violations.clone();
    sorted.sort();
    assert_eq!(violations, sorted, "violations come sorted");
    let pointers: Vec<&str> = violations.iter().map(|x| x.pointer.as_str()).collect();
    for p in [
        "",
        "/id",
        "/customer/email",
        "/customer/vip",
        "/lines/0/qty",
        "/lines/1",
        "/lines/1/qty",
        "/lines/2",
        "/status",
        "/note",
    ] {
        assert!(pointers.contains(&p), "no violation at {p:?}: {pointers:?}");
    }
    insta::assert_json_snapshot!(violations);
}

#[test]
fn output_validation_is_deterministic() {
    let v = OutputValidator::new(&order_schema()).unwrap();
    let bad = json!({"lines": [1, 2, 3], "extra": 1, "other": 2});
    assert_eq!(v.validate(&bad), v.validate(&bad));
    let again = OutputValidator::new(&order_schema()).unwrap();
    assert_eq!(v.validate(&bad), again.validate(&bad));
}

#[test]
fn any_of_failures_explain_each_option() {
    let v = OutputValidator::new(&order_schema()).unwrap();
    let violations = v.validate(
        &json!({"id": "ord_1", "customer": {"email": "a@b.co"}, "lines": [{"sku": "s", "qty": 1}],
                                        "status": "open", "note": 42}),
    );
    assert_eq!(violations.len(), 1);
    assert_eq!(violations[0].keyword, "anyOf");
    insta::assert_snapshot!(violations[0].to_string());
}

#[test]
fn long_messages_are_capped() {
    let v = OutputValidator::new(&json!({"type": "string"})).unwrap();
    let big = json!({"blob": "x".repeat(10_000)});
    let violations = v.validate(&big);
    assert_eq!(violations.len(), 1);
    let m = &violations[0].message;
    assert!(
        m.chars().count() <= MAX_MESSAGE_CHARS + 20,
        "{} chars",
        m.chars().count()
    );
    assert!(m.ends_with("(truncated)"));
}

#[test]
fn output_validator_rejects_invalid_schemas() {
    for schema in [
        json!({"type": 1}),
        json!("string"),
        json!({"$ref": "#/nowhere"}),
        json!({"minLength": -1}),
    ] {
        let err = OutputValidator::new(&schema).unwrap_err();
        assert_eq!(err.code(), "schema.invalid_schema", "{schema}");
        assert!(matches!(
            err,
            SchemaError::InvalidSchema {
                subject: Subject::OutputSchema,
                ..
            }
        ));
    }
}

#[test]
fn schemas_of_older_drafts_are_honoured() {
    let v = OutputValidator::new(&json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "definitions": {"n": {"type": "integer"}},
        "items": [{"$ref": "#/definitions/n"}, {"type": "string"}]
    }))
    .unwrap();
    assert!(v.is_valid(&json!([1, "a"])));
    assert!(!v.is_valid(&json!(["a", 1])));
}

fn refund_tool() -> Tool {
    Tool::from_value(json!({
        "_tool": "issueRefund", "_activity": "http", "_http": {"url": "http://x"},
        "type": "object",
        "properties": {
            "customerId": {"type": "string", "minLength": 3},
            "amount": {"type": "number", "exclusiveMinimum": 0},
            "currency": {"enum": ["EUR", "USD"]},
            "_instance": {"type": "integer"}
        },
        "required": ["customerId", "amount", "_instance"],
        "additionalProperties": false
    }))
    .unwrap()
}

#[test]
fn params_violations_are_all_reported() {
    let params = obj(json!({"customerId": "c", "amount": -5, "currency": "GBP", "reason": "late"}));
    let violations = validate_params(&refund_tool(), &params).unwrap();
    insta::assert_json_snapshot!(violations);
    let pointers: Vec<&str> = violations.iter().map(|v| v.pointer.as_str()).collect();
    assert_eq!(pointers, ["", "/amount", "/currency", "/customerId"]);
    let missing = validate_params(&refund_tool(), &Params::new()).unwrap();
    assert_eq!(
        missing.iter().filter(|v| v.keyword == "required").count(),
        2,
        "{missing:?}"
    );
}

#[test]
fn meta_keys_in_params_are_ignored() {
    // `_instance` is declared (and required) with the wrong type, and `_scopes` is undeclared
    // under additionalProperties false: neither matters, meta keys are not params.
    let params = obj(
        json!({"customerId": "cust", "amount": 5, "_instance": "row-1", "_scopes": ["a"], "_x": 1}),
    );
    assert_eq!(validate_params(&refund_tool(), &params).unwrap(), vec![]);
}

#[test]
fn params_validator_is_reusable() {
    let v = ParamsValidator::new(&refund_tool()).unwrap();
    assert_eq!(v.tool(), "issueRefund");
    assert!(
        v.validate(&obj(json!({"customerId": "cust", "amount": 1})))
            .is_empty()
    );
    assert_eq!(
        v.validate(&obj(json!({"customerId": "cust", "amount": "1"})))
            .len(),
        1
    );
}

#[test]
fn tool_validators_are_keyed_by_name() {
    let mut tools = ToolValidators::new(&[refund_tool(), Tool::new("ping")]).unwrap();
    assert_eq!(tools.names().collect::<Vec<_>>(), ["issueRefund", "ping"]);
    assert!(
        tools
            .validate("ping", &obj(json!({"any": 1})))
            .unwrap()
            .is_empty()
    );
    let err = tools.validate("pong", &Params::new()).unwrap_err();
    assert_eq!(err.code(), "schema.tool_not_found");
    assert_eq!(err.to_string(), "unknown tool `pong`");
    // Replacing a definition replaces its validator.
    let strict = Tool::from_value(json!({"_tool": "ping", "additionalProperties": false})).unwrap();
    tools.insert(&strict).unwrap();
    assert_eq!(
        tools
            .validate("ping", &obj(json!({"any": 1})))
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn invalid_tool_schemas_are_typed_errors() {
    let bad =
        Tool::from_value(json!({"_tool": "t", "properties": {"a": {"minimum": "zero"}}})).unwrap();
    let err = validate_params(&bad, &Params::new()).unwrap_err();
    assert_eq!(err.code(), "schema.invalid_schema");
    match &err {
        SchemaError::InvalidSchema {
            subject, pointer, ..
        } => {
            assert_eq!(subject, &Subject::ToolParams("t".into()));
            assert_eq!(pointer, "/properties/a/minimum");
        }
        other => panic!("{other:?}"),
    }
    assert!(ToolValidators::new(&[bad]).is_err());
}

#[test]
fn violation_display_names_the_place() {
    let v = Violation {
        pointer: String::new(),
        schema_pointer: "/required".into(),
        keyword: "required".into(),
        message: "\"a\" is a required property".into(),
    };
    assert_eq!(v.to_string(), "at the root: \"a\" is a required property");
    let v = Violation {
        pointer: "/a/0".into(),
        ..v
    };
    assert_eq!(v.to_string(), "at /a/0: \"a\" is a required property");
}
