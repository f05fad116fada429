//! OpenAI strict structured outputs: whether a schema fits OpenAI's documented strict subset,
//! and the schema transformed to fit it.
//!
//! The documented rules (OpenAI "Structured Outputs", supported schemas): the root is an object
//! (not `anyOf`); every object lists all its properties in `required` (an optional property is
//! emulated as a union with `null`); every object has `additionalProperties: false`; only these
//! keywords are supported: `type`, `properties`, `required`, `additionalProperties`, `items`,
//! `enum`, `const`, `anyOf`, `$ref`, `$defs`, `description`, `title`, string `pattern` and
//! `format` (`date-time`, `time`, `date`, `duration`, `email`, `hostname`, `ipv4`, `ipv6`,
//! `uuid`), number `multipleOf`, `maximum`, `exclusiveMaximum`, `minimum`, `exclusiveMinimum`,
//! array `minItems`, `maxItems`; at most 5000 properties, 10 levels of object nesting and 1000
//! enum values. Pure annotations (`$schema`, `$comment`, `examples`, `default`, `deprecated`) are
//! dropped; anything else means the schema does not fit.
//!
//! The transform only narrows what a schema accepts (extra properties are refused) and widens
//! optional properties to also accept `null`: a model in strict mode writes `null` for a
//! property it would have left out. [`drop_strict_nulls`] undoes that widening on what the
//! model wrote, driven by the original schema: it is the one place where such nulls are
//! dropped (the engine applies it to every call and output of a strict answer, before anything
//! validates or uses them).

use serde_json::{Map, Value, json};

use crate::protocol::Call;

/// Keywords kept as they are.
const KEPT: [&str; 21] = [
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "anyOf",
    "$ref",
    "$defs",
    "description",
    "title",
    "pattern",
    "format",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "minItems",
    "maxItems",
];
/// Keywords that only annotate, dropped by the transform.
const DROPPED: [&str; 5] = ["$schema", "$comment", "examples", "default", "deprecated"];
/// `format` values strict mode supports.
const FORMATS: [&str; 9] = [
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uuid",
];
const MAX_PROPERTIES: usize = 5000;
const MAX_NESTING: usize = 10;
const MAX_ENUM_VALUES: usize = 1000;

/// The schema transformed to OpenAI's strict subset, or why it does not fit (naming the place).
pub fn strict_schema(schema: &Value) -> Result<Value, String> {
    let Some(root) = schema.as_object() else {
        return Err("the root is not a schema object".into());
    };
    if root.contains_key("anyOf") || !is_object_schema(root) {
        return Err("the root must be an object schema (not anyOf)".into());
    }
    let mut walk = Walk { properties: 0 };
    walk.schema(schema, "#", 0)
}

struct Walk {
    properties: usize,
}

fn is_object_schema(m: &Map<String, Value>) -> bool {
    match m.get("type") {
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        _ => m.contains_key("properties"),
    }
}

fn accepts_null(v: &Value) -> bool {
    match v {
        Value::Object(m) => {
            let typed = match m.get("type") {
                Some(Value::String(t)) => t == "null",
                Some(Value::Array(ts)) => ts.iter().any(|t| t == "null"),
                _ => false,
            };
            typed
                || m.get("const") == Some(&Value::Null)
                || m.get("enum")
                    .and_then(Value::as_array)
                    .is_some_and(|e| e.contains(&Value::Null))
                || m.get("anyOf")
                    .and_then(Value::as_array)
                    .is_some_and(|bs| bs.iter().any(accepts_null))
        }
        _ => false,
    }
}

impl Walk {
    fn schema(&mut self, schema: &Value, at: &str, depth: usize) -> Result<Value, String> {
        let m = match schema {
            Value::Object(m) => m,
            Value::Bool(b) => return Err(format!("`{b}` as a schema at {at}")),
            _ => return Err(format!("a non-schema value at {at}")),
        };
        let mut out = Map::new();
        for (k, v) in m {
            let kept = KEPT.contains(&k.as_str());
            if DROPPED.contains(&k.as_str()) {
                continue;
            }
            if !kept {
                return Err(format!("`{k}` at {at} is not in the strict subset"));
            }
            out.insert(k.clone(), v.clone());
        }
        if let Some(Value::String(r)) = m.get("$ref")
            && !r.starts_with('#')
        {
            return Err(format!("`$ref` to `{r}` at {at} is not local"));
        }
        if let Some(f) = m.get("format").and_then(Value::as_str)
            && !FORMATS.contains(&f)
        {
            return Err(format!("format `{f}` at {at} is not supported"));
        }
        if let Some(e) = m.get("enum").and_then(Value::as_array)
            && e.len() > MAX_ENUM_VALUES
        {
            return Err(format!("more than {MAX_ENUM_VALUES} enum values at {at}"));
        }
        let constrained = ["type", "anyOf", "enum", "const", "$ref"]
            .iter()
            .any(|k| m.contains_key(*k))
            || m.contains_key("properties");
        if !constrained {
            return Err(format!("the schema at {at} accepts any value"));
        }
        if let Some(Value::Object(defs)) = m.get("$defs") {
            let mut new = Map::new();
            for (name, d) in defs {
                new.insert(
                    name.clone(),
                    self.schema(d, &format!("{at}/$defs/{name}"), 0)?,
                );
            }
            out.insert("$defs".into(), Value::Object(new));
        }
        if let Some(Value::Array(branches)) = m.get("anyOf") {
            let mut new = Vec::with_capacity(branches.len());
            for (i, b) in branches.iter().enumerate() {
                new.push(self.schema(b, &format!("{at}/anyOf/{i}"), depth)?);
            }
            out.insert("anyOf".into(), Value::Array(new));
        }
        let is_array = match m.get("type") {
            Some(Value::String(t)) => t == "array",
            Some(Value::Array(ts)) => ts.iter().any(|t| t == "array"),
            _ => false,
        };
        if is_array {
            match m.get("items") {
                Some(items) => {
                    let items = self.schema(items, &format!("{at}/items"), depth)?;
                    out.insert("items".into(), items);
                }
                None => return Err(format!("the array at {at} has no `items`")),
            }
        }
        if is_object_schema(m) {
            self.object(m, &mut out, at, depth + 1)?;
        }
        Ok(Value::Object(out))
    }

    fn object(
        &mut self,
        m: &Map<String, Value>,
        out: &mut Map<String, Value>,
        at: &str,
        depth: usize,
    ) -> Result<(), String> {
        if depth > MAX_NESTING {
            return Err(format!(
                "objects nest deeper than {MAX_NESTING} levels at {at}"
            ));
        }
        match m.get("additionalProperties") {
            None | Some(Value::Bool(false)) => {}
            Some(_) => {
                return Err(format!("the object at {at} allows additional properties"));
            }
        }
        let Some(Value::Object(props)) = m.get("properties") else {
            return Err(format!(
                "the object at {at} has no `properties` (free-form)"
            ));
        };
        self.properties += props.len();
        if self.properties > MAX_PROPERTIES {
            return Err(format!("more than {MAX_PROPERTIES} properties in all"));
        }
        let required: Vec<&str> = m
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut new = Map::new();
        for (name, p) in props {
            let p = self.schema(p, &format!("{at}/properties/{name}"), depth)?;
            let p = if required.contains(&name.as_str()) || accepts_null(&p) {
                p
            } else {
                json!({"anyOf": [p, {"type": "null"}]})
            };
            new.insert(name.clone(), p);
        }
        out.insert(
            "required".into(),
            Value::Array(props.keys().map(|k| Value::from(k.as_str())).collect()),
        );
        out.insert("properties".into(), Value::Object(new));
        out.insert("additionalProperties".into(), Value::Bool(false));
        Ok(())
    }
}

/// How many `$ref`s and `anyOf`s are followed without moving into the value (a bound for
/// schemas whose references loop).
const MAX_HOPS: u32 = 32;

/// Undoes strict mode's widening on `value`, written by a model constrained by the strict
/// transform of `schema`: every `null` of an object property that `schema` neither requires
/// nor allows to be null is removed (the model meant "absent"). Everything else is left as it
/// is: a `null` the original schema requires or allows stays, and so does any value that is
/// wrong for other reasons (validation reports it). `root` resolves local `$ref`s (`#/$defs/..`).
///
/// Under `anyOf`, the branch that applies is the one strict mode forced: for an object, the
/// object schema whose properties are exactly the object's keys (strict objects list every
/// property and allow no other), else the first whose properties include them all; for an
/// array, the first array schema.
pub fn drop_strict_nulls(schema: &Value, root: &Value, value: &mut Value) {
    undo(schema, root, value, 0);
}

/// [`drop_strict_nulls`] for a call, against its tool's branch of the composed Solution schema
/// (`calls.items.anyOf`, the branch whose `_tool` is the call's). Meta fields that are `null`
/// were already read as absent by `Call::try_from`; this drops the params'.
pub fn drop_strict_nulls_in_call(composed: &Value, call: &mut Call) {
    let Some(branch) = composed
        .pointer("/properties/calls/items/anyOf")
        .and_then(Value::as_array)
        .and_then(|bs| {
            bs.iter().find(|b| {
                b.pointer("/properties/_tool/const").and_then(Value::as_str)
                    == Some(call.tool.as_str())
            })
        })
    else {
        return;
    };
    undo_members(branch, composed, &mut call.params, 0);
}

/// [`drop_strict_nulls`] for a Solution's `output`, against the user's output schema as the
/// composed Solution schema holds it (`output.anyOf[0]`).
pub fn drop_strict_nulls_in_output(composed: &Value, output: &mut Value) {
    if let Some(schema) = composed.pointer("/properties/output/anyOf/0") {
        undo(schema, composed, output, 0);
    }
}

/// The schema a local `$ref` points at (None when it is not local or points at nothing).
fn target<'a>(root: &'a Value, r: &str) -> Option<&'a Value> {
    root.pointer(r.strip_prefix('#')?)
}

fn undo(schema: &Value, root: &Value, value: &mut Value, hops: u32) {
    if hops > MAX_HOPS || value.is_null() {
        return;
    }
    let Value::Object(s) = schema else { return };
    if let Some(t) = s
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| target(root, r))
    {
        undo(t, root, value, hops + 1);
    }
    if let Some(Value::Array(branches)) = s.get("anyOf")
        && let Some(b) = forced_branch(branches, root, value)
    {
        undo(b, root, value, hops + 1);
    }
    match value {
        Value::Object(m) => undo_members(schema, root, m, hops),
        Value::Array(items) => {
            if let Some(item) = s.get("items") {
                for v in items {
                    undo(item, root, v, 0);
                }
            }
        }
        _ => {}
    }
}

/// The object's members against the object schema `schema` (its `properties` and `required`).
fn undo_members(schema: &Value, root: &Value, m: &mut Map<String, Value>, hops: u32) {
    let Some(Value::Object(props)) = schema.get("properties") else {
        return;
    };
    let required = |k: &str| {
        schema
            .get("required")
            .and_then(Value::as_array)
            .is_some_and(|r| r.iter().any(|x| x.as_str() == Some(k)))
    };
    m.retain(|k, v| {
        !(v.is_null()
            && props
                .get(k)
                .is_some_and(|p| !required(k) && !allows_null(p, root, hops)))
    });
    for (k, v) in m.iter_mut() {
        if let Some(p) = props.get(k) {
            undo(p, root, v, 0);
        }
    }
}

/// The `anyOf` branch strict mode made the model follow for `value` (see [`drop_strict_nulls`]).
fn forced_branch<'a>(branches: &'a [Value], root: &'a Value, value: &Value) -> Option<&'a Value> {
    let resolved = |b: &'a Value| -> &'a Value {
        let mut b = b;
        for _ in 0..MAX_HOPS {
            match b
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| target(root, r))
            {
                Some(t) => b = t,
                None => break,
            }
        }
        b
    };
    match value {
        Value::Object(m) => {
            let names = |b: &Value| -> Option<Vec<String>> {
                let props = b.get("properties")?.as_object()?;
                Some(props.keys().cloned().collect())
            };
            let candidates: Vec<(&Value, Vec<String>)> = branches
                .iter()
                .map(resolved)
                .filter_map(|b| names(b).map(|n| (b, n)))
                .collect();
            candidates
                .iter()
                .find(|(_, n)| n.len() == m.len() && m.keys().all(|k| n.contains(k)))
                .or_else(|| {
                    candidates
                        .iter()
                        .find(|(_, n)| m.keys().all(|k| n.contains(k)))
                })
                .map(|(b, _)| *b)
        }
        Value::Array(_) => branches
            .iter()
            .map(resolved)
            .find(|b| b.get("items").is_some() || has_type(b, "array")),
        _ => None,
    }
}

fn has_type(schema: &Value, t: &str) -> bool {
    match schema.get("type") {
        Some(Value::String(s)) => s == t,
        Some(Value::Array(ts)) => ts.iter().any(|x| x == t),
        _ => false,
    }
}

/// Whether the original schema lets a value be `null`: `true`, `{}`, a null type, const or
/// enum member, a nullable `anyOf` branch or `$ref` target, or no type constraint at all.
fn allows_null(schema: &Value, root: &Value, hops: u32) -> bool {
    if hops > MAX_HOPS {
        return true;
    }
    let m = match schema {
        Value::Bool(b) => return *b,
        Value::Object(m) => m,
        _ => return true,
    };
    if let Some(r) = m.get("$ref").and_then(Value::as_str) {
        return target(root, r).is_none_or(|t| allows_null(t, root, hops + 1));
    }
    if let Some(Value::Array(bs)) = m.get("anyOf") {
        return bs.iter().any(|b| allows_null(b, root, hops + 1));
    }
    if let Some(c) = m.get("const") {
        return c.is_null();
    }
    if let Some(Value::Array(e)) = m.get("enum") {
        return e.contains(&Value::Null);
    }
    match m.get("type") {
        Some(_) => has_type(schema, "null"),
        None => !m.contains_key("properties") && !m.contains_key("items"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fits(v: Value) -> Value {
        strict_schema(&v).unwrap_or_else(|e| panic!("{e}: {v}"))
    }

    fn refused(v: Value) -> String {
        strict_schema(&v).unwrap_err()
    }

    /// Checks a transformed schema against the documented rules, everywhere in it.
    fn obeys_the_rules(v: &Value) {
        let Value::Object(m) = v else { return };
        for k in m.keys() {
            assert!(KEPT.contains(&k.as_str()), "`{k}` in {v}");
        }
        if let Some(Value::Object(props)) = m.get("properties") {
            assert_eq!(m["additionalProperties"], false, "{v}");
            let req: Vec<&str> = m["required"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_str().unwrap())
                .collect();
            let names: Vec<&str> = props.keys().map(String::as_str).collect();
            assert_eq!(req, names, "every property is required: {v}");
        }
        for (k, child) in m {
            match (k.as_str(), child) {
                ("properties" | "$defs", Value::Object(c)) => c.values().for_each(obeys_the_rules),
                ("items", c) => obeys_the_rules(c),
                ("anyOf", Value::Array(a)) => a.iter().for_each(obeys_the_rules),
                _ => {}
            }
        }
    }

    #[test]
    fn optional_properties_become_required_and_nullable() {
        let s = fits(json!({
            "type": "object",
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "properties": {
                "a": {"type": "string", "default": "x"},
                "b": {"type": "integer", "minimum": 1},
                "c": {"type": ["string", "null"]},
                "d": {"type": "object", "properties": {"e": {"enum": ["x", "y"]}}}
            },
            "required": ["a"]
        }));
        obeys_the_rules(&s);
        assert_eq!(s["properties"]["a"], json!({"type": "string"}));
        assert_eq!(
            s["properties"]["b"],
            json!({"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]})
        );
        // Already nullable: left as it is.
        assert_eq!(s["properties"]["c"], json!({"type": ["string", "null"]}));
        assert_eq!(
            s["properties"]["d"]["anyOf"][0]["properties"]["e"]["anyOf"][0],
            json!({"enum": ["x", "y"]})
        );
        assert!(s.get("$schema").is_none());
    }

    #[test]
    fn defs_refs_and_any_of_are_walked() {
        let s = fits(json!({
            "type": "object",
            "properties": {"n": {"$ref": "#/$defs/node"}, "u": {"anyOf": [
                {"type": "object", "properties": {"k": {"type": "string"}}},
                {"type": "null"}
            ]}},
            "required": ["n", "u"],
            "$defs": {"node": {"type": "object", "properties": {
                "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}
            }}}
        }));
        obeys_the_rules(&s);
        assert_eq!(s["$defs"]["node"]["required"], json!(["next", "tags"]));
        assert_eq!(s["properties"]["u"]["anyOf"][0]["required"], json!(["k"]));
    }

    #[test]
    fn schemas_outside_the_subset_are_refused_with_the_place() {
        let obj = |p: Value| json!({"type": "object", "properties": {"p": p}});
        for (schema, needle) in [
            (json!({"anyOf": [{"type": "object"}]}), "root"),
            (json!({"type": "string"}), "root"),
            (
                obj(json!({"type": "string", "minLength": 1})),
                "`minLength` at #/properties/p",
            ),
            (obj(json!({"allOf": [{"type": "string"}]})), "`allOf`"),
            (obj(json!({"oneOf": [{"type": "string"}]})), "`oneOf`"),
            (obj(json!({"not": {"type": "string"}})), "`not`"),
            (obj(json!({})), "accepts any value"),
            (obj(json!(true)), "`true` as a schema"),
            (obj(json!({"type": "object"})), "free-form"),
            (obj(json!({"type": "array"})), "no `items`"),
            (
                obj(json!({"type": "string", "format": "uri"})),
                "format `uri`",
            ),
            (obj(json!({"$ref": "other.json"})), "not local"),
            (
                json!({"type": "object", "properties": {}, "additionalProperties": true}),
                "additional properties",
            ),
            (
                json!({"type": "object", "properties": {"m": {"type": "object",
                    "properties": {}, "additionalProperties": {"type": "string"}}}}),
                "#/properties/m allows additional",
            ),
            (
                obj(json!({"enum": (0..1001).collect::<Vec<_>>()})),
                "more than 1000 enum values",
            ),
        ] {
            let why = refused(schema.clone());
            assert!(why.contains(needle), "{schema}: {why}");
        }
        let mut deep = json!({"type": "string"});
        for _ in 0..11 {
            deep = json!({"type": "object", "properties": {"x": deep}});
        }
        assert!(refused(deep).contains("deeper than 10"));
    }

    #[test]
    fn the_composed_schema_of_a_small_goal_fits() {
        let tool = crate::protocol::Tool::from_value(json!({
            "_tool": "greet", "type": "object",
            "properties": {"name": {"type": "string"}}, "required": ["name"],
            "_output": {"type": "object", "required": ["greeting"],
                        "properties": {"greeting": {"type": "string"}}}
        }))
        .unwrap();
        let output = json!({"type": "object", "required": ["name"],
            "properties": {"name": {"type": "string"}}, "additionalProperties": false});
        let composed = crate::schema::compose(&[tool], &output).unwrap();
        let s = fits(composed);
        obeys_the_rules(&s);
        assert_eq!(s["required"], json!(["thoughts", "calls", "output"]));
        // Optional meta fields are nullable, so the model may write null for them.
        let branch = &s["properties"]["calls"]["items"]["anyOf"][0];
        assert!(accepts_null(&branch["properties"]["_outputPath"]));
        assert!(!accepts_null(&branch["properties"]["name"]));
        // A latent tool without an `_output` schema accepts any value: not strict.
        let free = crate::protocol::Tool::from_value(json!({"_tool": "t"})).unwrap();
        let composed = crate::schema::compose(&[free], &json!({"type": "string"})).unwrap();
        assert!(strict_schema(&composed).unwrap_err().contains("_output"));
    }

    fn undone(schema: Value, mut v: Value) -> Value {
        drop_strict_nulls(&schema, &schema, &mut v);
        v
    }

    #[test]
    fn nulls_the_original_schema_forbids_on_optional_properties_are_dropped() {
        let schema = json!({
            "type": "object",
            "required": ["id", "must"],
            "properties": {
                "id": {"type": "string"},
                "must": {"type": "string"},
                "opt": {"type": "string"},
                "maybe": {"type": ["string", "null"]},
                "either": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                "free": {},
                "nested": {"type": "object", "properties": {
                    "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a"]},
                "list": {"type": "array", "items": {"type": "object",
                    "properties": {"x": {"type": "integer"}}}}
            }
        });
        let v = undone(
            schema,
            json!({"id": "1", "must": null, "opt": null, "maybe": null, "either": null,
                   "free": null, "nested": {"a": null, "b": null},
                   "list": [{"x": null}, {"x": 2}], "unknown": null}),
        );
        assert_eq!(
            v,
            json!({"id": "1", "must": null, "maybe": null, "either": null, "free": null,
                   "nested": {"a": null}, "list": [{}, {"x": 2}], "unknown": null}),
            "required, nullable and unknown nulls stay (validation judges them)"
        );
    }

    #[test]
    fn any_of_follows_the_branch_strict_mode_forced_and_refs_resolve() {
        // A param that also accepts a reference string, and two object shapes.
        let schema = json!({
            "type": "object",
            "properties": {
                "p": {"anyOf": [
                    {"type": "object", "properties": {"k": {"type": "string"}, "n": {"type": "string"}}},
                    {"type": "object", "properties": {"k": {"type": "string"}, "m": {"type": ["string", "null"]}}},
                    {"type": "string", "pattern": "^†"}
                ]},
                "r": {"$ref": "#/$defs/node"},
                "tags": {"anyOf": [{"type": "array", "items": {"$ref": "#/$defs/node"}},
                                   {"type": "string"}]}
            },
            "$defs": {"node": {"type": "object", "properties": {
                "next": {"$ref": "#/$defs/node"}, "v": {"type": "integer"},
                "loop": {"$ref": "#/$defs/loop"}}},
                "loop": {"$ref": "#/$defs/loop"}}
        });
        let v = undone(
            schema.clone(),
            json!({"p": {"k": null, "m": null}, "r": {"next": {"v": null, "next": null}, "v": 1},
                   "tags": [{"v": null, "loop": null}]}),
        );
        assert_eq!(
            v,
            json!({"p": {"m": null}, "r": {"next": {}, "v": 1}, "tags": [{"loop": null}]}),
            "the second branch (keys k, m) applied; `next` (a $ref to an object) is not nullable"
        );
        // A reference string instead of the object: nothing to do.
        assert_eq!(
            undone(schema, json!({"p": "†state.x"})),
            json!({"p": "†state.x"})
        );
    }

    #[test]
    fn a_strict_answer_to_a_composed_schema_comes_back_as_the_original_allows() {
        let tool = crate::protocol::Tool::from_value(json!({
            "_tool": "greet", "_activity": "rust", "type": "object",
            "properties": {"name": {"type": "string"}, "title": {"type": "string"}},
            "required": ["name"]
        }))
        .unwrap();
        let output = json!({"type": "object", "required": ["name"], "additionalProperties": false,
            "properties": {"name": {"type": "string"}, "nickname": {"type": "string"}}});
        let composed = crate::schema::compose(&[tool], &output).unwrap();
        assert!(strict_schema(&composed).is_ok(), "the goal is sent strict");
        let mut call = Call::try_from(json!({"_tool": "greet", "name": "Ada", "title": null,
            "_outputPath": null, "_outputMethod": null}))
        .unwrap();
        drop_strict_nulls_in_call(&composed, &mut call);
        assert_eq!(call.to_value(), json!({"_tool": "greet", "name": "Ada"}));
        let mut out = json!({"name": "Ada", "nickname": null});
        drop_strict_nulls_in_output(&composed, &mut out);
        assert_eq!(out, json!({"name": "Ada"}));
        // A call of a tool the schema does not know is left alone.
        let mut other = Call::try_from(json!({"_tool": "nope", "x": null})).unwrap();
        drop_strict_nulls_in_call(&composed, &mut other);
        assert_eq!(other.params.get("x"), Some(&Value::Null));
    }
}
