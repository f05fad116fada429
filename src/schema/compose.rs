//! The schema sent to the model for one Request, composed from the tools and the output schema.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::refs::Hoister;
use super::validate::{compile, params_schema};
use super::{SchemaError, Subject, cap_message};
use crate::protocol::{Call, OutputMethod, Tool};

/// Pattern of a string that is a reference (`†...` or `$ref:...`).
///
/// Anchored at both ends and written in the subset every grammar engine accepts (llama.cpp's
/// JSON-Schema-to-grammar, llguidance, outlines-core): no `\s`, no `\$`, no lookaround. The
/// tail is `[^"\\]*`, not `.*`: a `.` that may match the closing quote makes outlines-core's
/// automaton explode (minutes and gigabytes for the example goals). So the schema describes
/// references without `"` or `\`; the reference parser itself accepts those, and leading
/// blanks, too: the schema only steers decoders.
pub const REFERENCE_PATTERN: &str = r#"^(†|[$]ref:)[^"\\]*$"#;

/// The schema every top-level param also accepts, so that constrained decoders let the model
/// write a reference where a value is expected.
pub fn reference_string_schema() -> Value {
    json!({"type": "string", "pattern": REFERENCE_PATTERN})
}

pub use crate::protocol::is_meta_key;

/// Composes the schema of one Request.
///
/// The result is an object with an optional `thoughts` string, a required `calls` array whose
/// items are any of the tools' call schemas, and a required `output` that is the user's schema
/// or null; no other property is allowed. See `spec/schema.md` for every rule.
///
/// Each part is compiled on its own first, so an invalid part is reported against that part
/// with a pointer into it ([`SchemaError::InvalidSchema`]).
pub fn compose(tools: &[Tool], output_schema: &Value) -> Result<Value, SchemaError> {
    compile(output_schema, &Subject::OutputSchema)?;
    let tools = last_definitions(tools);
    let mut hoister = Hoister::default();
    let output = hoister.embed(output_schema, "output", &Subject::OutputSchema)?;
    let mut branches = Vec::with_capacity(tools.len());
    for tool in tools {
        branches.push(tool_call_schema(tool, &mut hoister)?);
    }

    let calls = if branches.is_empty() {
        // `const: []` rather than `maxItems: 0`: llama.cpp's JSON-Schema-to-grammar ignores a
        // zero `maxItems` and would let the model write calls to tools that do not exist.
        json!({"type": "array", "const": [], "description": "No tools are available: leave empty."})
    } else {
        json!({
            "type": "array",
            "description": "Tool calls to run now. Params may be references such as †state.x.",
            "items": {"anyOf": branches},
        })
    };
    let mut top = json!({
        "type": "object",
        "properties": {
            "thoughts": {"type": "string", "description": "Your reasoning, before you act."},
            "calls": calls,
            "output": {
                "description": "The final result, or null while calls are still needed.",
                "anyOf": [output, {"type": "null"}],
            },
        },
        "required": ["calls", "output"],
        "additionalProperties": false,
    });
    let defs = hoister.into_defs();
    if !defs.is_empty()
        && let Value::Object(m) = &mut top
    {
        m.insert("$defs".into(), Value::Object(defs));
    }
    compile(&top, &Subject::Composed)?;
    Ok(top)
}

/// The tools that count: for each name, its last definition, in the order of those definitions.
pub(crate) fn last_definitions(tools: &[Tool]) -> Vec<&Tool> {
    let last: BTreeMap<&str, usize> = tools
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect();
    tools
        .iter()
        .enumerate()
        .filter(|(i, t)| last.get(t.name.as_str()) == Some(i))
        .map(|(_, t)| t)
        .collect()
}

/// Refuses names a call could not carry.
fn check_name(name: &str) -> Result<(), SchemaError> {
    let reason = if name.trim().is_empty() {
        "a tool name must not be empty"
    } else if name.chars().any(char::is_control) {
        "a tool name must not contain control characters"
    } else {
        return Ok(());
    };
    Err(SchemaError::InvalidToolName {
        name: name.to_string(),
        reason,
    })
}

/// The schema of a call to `tool`, as one branch of `calls.items.anyOf`.
fn tool_call_schema(tool: &Tool, hoister: &mut Hoister) -> Result<Value, SchemaError> {
    let name = tool.name.as_str();
    check_name(name)?;
    let params_subject = Subject::ToolParams(name.to_string());
    compile(&Value::Object(params_schema(&tool.schema)), &params_subject)?;
    check_object_type(tool)?;
    let output_subject = Subject::ToolOutput(name.to_string());
    let latent_output = match (&tool.output, tool.is_latent()) {
        (_, false) => None,
        (Some(out), true) => {
            compile(out, &output_subject)?;
            Some(hoister.embed(out, &format!("tool.{name}._output"), &output_subject)?)
        }
        (None, true) => Some(json!({})),
    };
    let (path_schema, path_required) = declared_meta(tool, "_outputPath")?;
    let (method_schema, method_required) = declared_meta(tool, "_outputMethod")?;

    let doc: Map<String, Value> = tool
        .schema
        .iter()
        .filter(|(k, _)| !is_meta_key(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut doc = hoister.embed_object(doc, &format!("tool.{name}"), &params_subject)?;
    doc.shift_remove("type");

    let mut props = Map::new();
    props.insert("_tool".into(), json!({"const": name}));
    if let Some(Value::Object(given)) = doc.shift_remove("properties") {
        for (k, p) in given {
            match k.as_str() {
                "_tool" | "_output" | "_outputPath" | "_outputMethod" => {}
                _ if is_meta_key(&k) => {
                    props.insert(k, p);
                }
                _ => {
                    props.insert(k, accept_reference(p));
                }
            }
        }
    }
    props.insert(
        "_outputPath".into(),
        path_schema.unwrap_or_else(|| {
            json!({
                "type": "string",
                "pattern": REFERENCE_PATTERN,
                "description": "Where to write the result, e.g. †state.x (omit to write nothing).",
            })
        }),
    );
    props.insert(
        "_outputMethod".into(),
        method_schema.unwrap_or_else(|| {
            let names: Vec<&str> = OutputMethod::ALL.iter().map(|m| m.as_str()).collect();
            json!({"type": "string", "enum": names})
        }),
    );
    if let Some(out) = latent_output {
        props.insert("_output".into(), out);
    }

    let mut required = vec![Value::from("_tool")];
    if let Some(Value::Array(given)) = doc.shift_remove("required") {
        for r in given {
            let skip = matches!(
                r.as_str(),
                Some("_tool" | "_output" | "_outputPath" | "_outputMethod")
            );
            if !skip && !required.contains(&r) {
                required.push(r);
            }
        }
    }
    if path_required {
        required.push("_outputPath".into());
    }
    if method_required {
        required.push("_outputMethod".into());
    }
    if tool.is_latent() {
        required.push("_output".into());
    }

    let mut out = Map::new();
    out.insert("type".into(), "object".into());
    if let Some(d) = doc.shift_remove("description") {
        out.insert("description".into(), d);
    }
    out.insert("properties".into(), Value::Object(props));
    out.insert("required".into(), Value::Array(required));
    for (k, v) in doc {
        let v = match k.as_str() {
            "additionalProperties" if v.is_object() => accept_reference(v),
            "patternProperties" => match v {
                Value::Object(pp) => Value::Object(
                    pp.into_iter()
                        .map(|(p, s)| (p, accept_reference(s)))
                        .collect(),
                ),
                other => other,
            },
            _ => v,
        };
        out.insert(k, v);
    }
    Ok(Value::Object(out))
}

/// Widens a param schema so that it also accepts a reference string.
fn accept_reference(schema: Value) -> Value {
    if schema == Value::Bool(true) {
        return schema;
    }
    json!({"anyOf": [schema, reference_string_schema()]})
}

/// A tool whose schema declares a `type` must include `object`.
fn check_object_type(tool: &Tool) -> Result<(), SchemaError> {
    let ok = match tool.schema.get("type") {
        None => true,
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        Some(_) => false,
    };
    if ok {
        return Ok(());
    }
    Err(SchemaError::ToolNotObject {
        tool: tool.name.clone(),
        found: tool
            .schema
            .get("type")
            .map(Value::to_string)
            .unwrap_or_default(),
    })
}

/// A tool's own schema for `_outputPath` / `_outputMethod` (meta key first, then `properties`),
/// and whether calls must carry it (a string or a schema with `const`).
fn declared_meta(tool: &Tool, field: &'static str) -> Result<(Option<Value>, bool), SchemaError> {
    let declared = tool
        .schema
        .get(field)
        .or_else(|| tool.schema.get("properties").and_then(|p| p.get(field)));
    let invalid = |reason: String| SchemaError::InvalidToolMeta {
        tool: tool.name.clone(),
        field,
        reason,
    };
    match declared {
        None | Some(Value::Bool(true)) => Ok((None, false)),
        Some(Value::String(s)) => {
            check_meta_value(tool, field, s).map_err(invalid)?;
            Ok((Some(json!({"type": "string", "const": s})), true))
        }
        Some(Value::Object(m)) => {
            let schema = Value::Object(m.clone());
            if let Err(SchemaError::InvalidSchema {
                message, pointer, ..
            }) = compile(&schema, &Subject::ToolParams(tool.name.clone()))
            {
                return Err(invalid(cap_message(format!(
                    "not a valid schema at `{pointer}`: {message}"
                ))));
            }
            if let Some(Value::String(s)) = m.get("const") {
                check_meta_value(tool, field, s).map_err(invalid)?;
            }
            Ok((Some(schema), m.contains_key("const")))
        }
        Some(other) => Err(invalid(format!(
            "expected a string or a schema object, found {}",
            crate::protocol::json_type(other)
        ))),
    }
}

/// A fixed `_outputPath` must parse as an output target; a fixed `_outputMethod` must exist.
fn check_meta_value(tool: &Tool, field: &str, value: &str) -> Result<(), String> {
    if field == "_outputMethod" {
        return match OutputMethod::ALL.iter().any(|m| m.as_str() == value) {
            true => Ok(()),
            false => Err(format!("unknown output method `{value}`")),
        };
    }
    match Call::new(tool.name.clone()).output(value).output_target() {
        Ok(_) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}
