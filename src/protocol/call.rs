//! Calls and tools as they travel between the model, the goal file and the scheduler.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::ProtocolError;
use super::params::Params;
use super::reference::{Expression, ReferenceError, parse_expression};

/// How a write combines with earlier writes to the same path (protocol chapter 008).
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum OutputMethod {
    /// Replace (last write wins). The default.
    #[default]
    Set,
    /// Deep merge of objects; anything else replaces.
    Merge,
    /// Shallow merge of objects; anything else replaces.
    Assign,
    /// Append the value as one element of an array.
    Push,
    /// Append the elements of an array value (a non-array value is appended as one element).
    Concat,
}

impl OutputMethod {
    /// All methods, in declaration order.
    pub const ALL: [OutputMethod; 5] = [
        OutputMethod::Set,
        OutputMethod::Merge,
        OutputMethod::Assign,
        OutputMethod::Push,
        OutputMethod::Concat,
    ];

    /// The method's name as written in `_outputMethod`.
    pub fn as_str(self) -> &'static str {
        match self {
            OutputMethod::Set => "set",
            OutputMethod::Merge => "merge",
            OutputMethod::Assign => "assign",
            OutputMethod::Push => "push",
            OutputMethod::Concat => "concat",
        }
    }

    fn parse(s: &str) -> Option<OutputMethod> {
        OutputMethod::ALL.into_iter().find(|m| m.as_str() == s)
    }
}

/// A request to run a tool: `{"_tool": "...", params..., "_outputPath": "...", ...}`.
///
/// Meta fields start with `_`; everything else is a parameter. Deserialising keeps unknown meta
/// fields in `params` (so a stored call always reads back); [`Call::parse`], which every input
/// goes through (the model's calls, goal plans, decisions), refuses them
/// ([`super::meta::CALL_META_KEYS`]).
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Value")]
pub struct Call {
    /// The tool's name.
    #[serde(rename = "_tool")]
    pub tool: String,
    /// Parameters, possibly containing references, plus any unknown fields.
    #[serde(flatten)]
    #[cfg_attr(feature = "server", schema(value_type = Map<String, Value>))]
    pub params: Params,
    /// Where the result is written (`†state.x`, `†a || †b`, `†a && †b`).
    #[serde(rename = "_outputPath", skip_serializing_if = "Option::is_none")]
    pub output_path: Option<String>,
    /// How the result combines with earlier writes.
    #[serde(rename = "_outputMethod", skip_serializing_if = "Option::is_none")]
    pub output_method: Option<OutputMethod>,
    /// Instance name (protocol chapter 013).
    #[serde(rename = "_instance", skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// Scopes a delegate or activity may see (protocol chapter 015).
    #[serde(rename = "_scopes", skip_serializing_if = "Option::is_none")]
    pub scopes: Option<Vec<String>>,
}

impl Call {
    /// A call with no params and no output path.
    pub fn new(tool: impl Into<String>) -> Self {
        Call {
            tool: tool.into(),
            params: Params::new(),
            output_path: None,
            output_method: None,
            instance: None,
            scopes: None,
        }
    }

    /// Adds a parameter (builder style).
    pub fn param(mut self, key: impl Into<String>, value: impl Into<Value>) -> Self {
        self.params.insert(key.into(), value.into());
        self
    }

    /// Sets `_outputPath` (builder style).
    pub fn output(mut self, path: impl Into<String>) -> Self {
        self.output_path = Some(path.into());
        self
    }

    /// Sets `_outputMethod` (builder style).
    pub fn method(mut self, method: OutputMethod) -> Self {
        self.output_method = Some(method);
        self
    }

    /// Reads a call from input (what a model, a goal file or a reviewer wrote): as
    /// [`Call::try_from`], and a meta key dagloop does not define is refused
    /// (`protocol.unknown_meta_key`, the closest known key suggested).
    pub fn parse(v: Value) -> Result<Call, ProtocolError> {
        Call::try_from(v)?.checked()
    }

    /// The call, when its params hold no meta key dagloop does not define (see [`Call::parse`]).
    pub fn checked(self) -> Result<Call, ProtocolError> {
        match self.unknown_meta_key() {
            None => Ok(self),
            Some(unknown) => Err(ProtocolError::UnknownMetaKey {
                what: "call",
                unknown,
            }),
        }
    }

    /// The first param that is a meta key dagloop does not define for calls.
    pub fn unknown_meta_key(&self) -> Option<super::meta::UnknownMetaKey> {
        super::meta::first_unknown(
            self.params.keys().map(String::as_str),
            super::meta::CALL_META_KEYS,
            &[],
        )
    }

    /// The parsed `_outputPath`, if any. Query tails are not allowed in output paths.
    pub fn output_target(&self) -> Result<Option<Expression>, ReferenceError> {
        let Some(text) = &self.output_path else {
            return Ok(None);
        };
        match parse_expression(text)? {
            None => Err(ReferenceError {
                text: text.clone(),
                position: 0,
                reason: "an output path must start with `†` or `$ref:`".into(),
            }),
            Some(e) => {
                if let Some(r) = e.refs.iter().find(|r| r.query.is_some()) {
                    return Err(ReferenceError {
                        text: text.clone(),
                        position: 0,
                        reason: format!("output path `{r}` cannot contain wildcards or filters"),
                    });
                }
                Ok(Some(e))
            }
        }
    }

    /// The method to use for writes (default `set`).
    pub fn method_or_default(&self) -> OutputMethod {
        self.output_method.unwrap_or_default()
    }

    /// The params a tool takes: every key but the `_` meta keys (`_tool`, `_outputPath`...).
    pub fn plain_params(&self) -> Map<String, Value> {
        without_meta(&self.params)
    }

    /// Every expression found in the params, at any depth, with a JSON pointer to where it sits.
    pub fn references(&self) -> Result<Vec<(String, Expression)>, ReferenceError> {
        let mut out = Vec::new();
        let mut pointer = String::new();
        for (k, v) in &self.params {
            pointer.push('/');
            push_escaped(&mut pointer, k);
            walk_refs(v, &mut pointer, &mut out)?;
            pointer.clear();
        }
        Ok(out)
    }

    /// The call as a JSON object (what the model wrote): what serialising it gives, built by
    /// cloning its parts (every call of a step goes into the next Request's plan this way).
    pub fn to_value(&self) -> Value {
        // Room for every field and the plan's `_status` and `_result`: no growth on the way.
        let mut m = Map::with_capacity(self.params.len() + 8);
        m.insert("_tool".into(), Value::String(self.tool.clone()));
        for (k, v) in &self.params {
            m.insert(k.clone(), v.clone());
        }
        if let Some(p) = &self.output_path {
            m.insert("_outputPath".into(), Value::String(p.clone()));
        }
        if let Some(method) = self.output_method {
            m.insert(
                "_outputMethod".into(),
                Value::String(method.as_str().into()),
            );
        }
        if let Some(i) = &self.instance {
            m.insert("_instance".into(), Value::String(i.clone()));
        }
        if let Some(s) = &self.scopes {
            let scopes = s.iter().cloned().map(Value::String).collect();
            m.insert("_scopes".into(), Value::Array(scopes));
        }
        Value::Object(m)
    }
}

/// Appends `k` as one JSON-pointer token (`~` as `~0`, `/` as `~1`).
fn push_escaped(pointer: &mut String, k: &str) {
    if !k.contains(['~', '/']) {
        return pointer.push_str(k);
    }
    for c in k.chars() {
        match c {
            '~' => pointer.push_str("~0"),
            '/' => pointer.push_str("~1"),
            c => pointer.push(c),
        }
    }
}

/// Collects every reference expression inside `v` (whole string values only, rule 1).
pub fn collect_refs(
    v: &Value,
    pointer: &str,
    out: &mut Vec<(String, Expression)>,
) -> Result<(), ReferenceError> {
    let mut pointer = pointer.to_string();
    walk_refs(v, &mut pointer, out)
}

/// [`collect_refs`] with one pointer buffer, extended and cut back on the way down (a pointer
/// is copied only for a reference found).
fn walk_refs(
    v: &Value,
    pointer: &mut String,
    out: &mut Vec<(String, Expression)>,
) -> Result<(), ReferenceError> {
    match v {
        Value::String(s) => {
            if let Some(e) = parse_expression(s)? {
                out.push((pointer.clone(), e));
            }
        }
        Value::Array(a) => {
            let len = pointer.len();
            for (i, x) in a.iter().enumerate() {
                use std::fmt::Write as _;
                let _ = write!(pointer, "/{i}");
                walk_refs(x, pointer, out)?;
                pointer.truncate(len);
            }
        }
        Value::Object(m) => {
            let len = pointer.len();
            for (k, x) in m {
                pointer.push('/');
                push_escaped(pointer, k);
                walk_refs(x, pointer, out)?;
                pointer.truncate(len);
            }
        }
        _ => {}
    }
    Ok(())
}

impl TryFrom<Value> for Call {
    type Error = ProtocolError;

    fn try_from(v: Value) -> Result<Self, Self::Error> {
        let Value::Object(mut m) = v else {
            return Err(ProtocolError::NotAnObject {
                what: "call",
                found: json_type(&v),
            });
        };
        SplitCall {
            tool: m.shift_remove("_tool"),
            output_path: m.shift_remove("_outputPath"),
            output_method: m.shift_remove("_outputMethod"),
            instance: m.shift_remove("_instance"),
            scopes: m.shift_remove("_scopes"),
            params: m,
        }
        .into_call()
    }
}

/// A call object as read: its meta fields apart, every other field a param (in order, a
/// repeated key's last value winning, as in a map). Deserialised straight from JSON text, it
/// saves building the object as a map and taking the meta fields back out of it; either way
/// [`SplitCall::into_call`] checks the meta fields, so both give the same call or error.
#[derive(Debug, Default)]
pub(crate) struct SplitCall {
    tool: Option<Value>,
    output_path: Option<Value>,
    output_method: Option<Value>,
    instance: Option<Value>,
    scopes: Option<Value>,
    params: Map<String, Value>,
}

impl<'de> Deserialize<'de> for SplitCall {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = SplitCall;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a call object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<SplitCall, A::Error> {
                let mut c = SplitCall::default();
                while let Some(key) = map.next_key::<String>()? {
                    let slot = match key.as_str() {
                        "_tool" => &mut c.tool,
                        "_outputPath" => &mut c.output_path,
                        "_outputMethod" => &mut c.output_method,
                        "_instance" => &mut c.instance,
                        "_scopes" => &mut c.scopes,
                        _ => {
                            let v = map.next_value()?;
                            c.params.insert(key, v);
                            continue;
                        }
                    };
                    *slot = Some(map.next_value()?);
                }
                Ok(c)
            }
        }
        d.deserialize_map(Fields)
    }
}

impl SplitCall {
    /// The call, once its meta fields check out.
    pub(crate) fn into_call(self) -> Result<Call, ProtocolError> {
        let SplitCall {
            tool,
            output_path,
            output_method,
            instance,
            scopes,
            params: m,
        } = self;
        let tool = match tool {
            Some(Value::String(s)) if !s.trim().is_empty() => s,
            Some(Value::String(_)) => {
                return Err(ProtocolError::InvalidField {
                    what: "call",
                    field: "_tool",
                    reason: "the tool name is empty".into(),
                });
            }
            Some(other) => {
                return Err(ProtocolError::InvalidField {
                    what: "call",
                    field: "_tool",
                    reason: format!("expected a non-empty string, found {}", json_type(&other)),
                });
            }
            None => {
                return Err(ProtocolError::MissingField {
                    what: "call",
                    field: "_tool",
                });
            }
        };
        let output_path = match output_path {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s),
            Some(other) => {
                return Err(ProtocolError::InvalidField {
                    what: "call",
                    field: "_outputPath",
                    reason: format!("expected a string, found {}", json_type(&other)),
                });
            }
        };
        let output_method = match output_method {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => match OutputMethod::parse(&s) {
                Some(m) => Some(m),
                None => return Err(ProtocolError::UnknownOutputMethod { tool, method: s }),
            },
            Some(other) => {
                return Err(ProtocolError::InvalidField {
                    what: "call",
                    field: "_outputMethod",
                    reason: format!("expected a string, found {}", json_type(&other)),
                });
            }
        };
        let instance = match instance {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s),
            Some(other) => Some(other.to_string()),
        };
        let scopes = match scopes {
            None | Some(Value::Null) => None,
            Some(v) => match serde_json::from_value::<Vec<String>>(v) {
                Ok(s) => Some(s),
                Err(e) => {
                    return Err(ProtocolError::InvalidField {
                        what: "call",
                        field: "_scopes",
                        reason: e.to_string(),
                    });
                }
            },
        };
        Ok(Call {
            tool,
            params: m.into(),
            output_path,
            output_method,
            instance,
            scopes,
        })
    }
}

/// A short name for a JSON value's type, for error messages.
pub fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Per-tool approval override (`_approval`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ToolApproval {
    /// Always ask a reviewer, whatever the policy.
    Always,
    /// Never ask: run as soon as unblocked.
    Never,
}

/// A tool: a JSON Schema for its params plus meta fields.
///
/// The schema itself and any extra fields (`_http`, `_delegate`, ...) live in `schema`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    /// The tool's name (`_tool`).
    #[serde(rename = "_tool")]
    pub name: String,
    /// Schema of the result. For a latent tool the model fills it in itself.
    #[serde(rename = "_output", default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// The activity that executes calls (`http`, `shell`, `rust`, `delegate`...). None = latent.
    #[serde(rename = "_activity", default, skip_serializing_if = "Option::is_none")]
    pub activity: Option<String>,
    /// Approval override.
    #[serde(rename = "_approval", default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ToolApproval>,
    /// The params schema and every other field, kept as written.
    #[serde(flatten)]
    pub schema: Map<String, Value>,
}

/// The built-in activity kinds (a registry may add more with `Registry::register_kind`).
pub const KINDS: [&str; 4] = ["delegate", "http", "rust", "shell"];

/// The activity kind a tool names: its `_activity`, `delegate` for a `_delegate` tool, none for a
/// latent tool ([`Tool::kind`]). The one answer the registry, `validate`, the grants and the
/// approval floor use.
pub fn kind_of(tool: &Tool) -> Option<&str> {
    tool.kind()
}

/// The names of the `${VAR}` placeholders in `text`, in order: what a goal or a tool config
/// reads from the environment of the process that runs it (a run's record keeps the names,
/// never the values).
pub fn env_placeholders(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("${") {
        let after = &rest[open + 2..];
        let Some(close) = after.find('}') else {
            break;
        };
        out.push(&after[..close]);
        rest = &after[close + 1..];
    }
    out
}

impl Tool {
    /// A tool with an empty object schema.
    pub fn new(name: impl Into<String>) -> Self {
        let mut schema = Map::new();
        schema.insert("type".into(), Value::String("object".into()));
        Tool {
            name: name.into(),
            output: None,
            activity: None,
            approval: None,
            schema,
        }
    }

    /// The kind its calls run under: its `_activity`, else `delegate` when it has `_delegate`;
    /// None for a latent tool.
    pub fn kind(&self) -> Option<&str> {
        match self.activity.as_deref() {
            Some(k) => Some(k),
            None if self.schema.contains_key("_delegate") => Some("delegate"),
            None => None,
        }
    }

    /// True when no activity executes the tool: the model fills `_output` itself.
    pub fn is_latent(&self) -> bool {
        self.activity.is_none() && !self.schema.contains_key("_delegate")
    }

    /// The first meta key of the definition dagloop does not define: not in
    /// [`super::meta::TOOL_META_KEYS`], not the settings of the tool's own kind (`_` + its
    /// `_activity`, for a kind a program registers), nor, among the params schema's `properties`, a call meta key
    /// ([`super::meta::CALL_META_KEYS`]: a call may only carry those).
    pub fn unknown_meta_key(&self) -> Option<(Option<&'static str>, super::meta::UnknownMetaKey)> {
        let own = self
            .activity
            .as_ref()
            .filter(|k| !super::meta::BUILT_IN_KINDS.contains(&k.as_str()))
            .map(|k| format!("_{k}"));
        let extra: Vec<&str> = own.iter().map(String::as_str).collect();
        if let Some(u) = super::meta::first_unknown(
            self.schema.keys().map(String::as_str),
            super::meta::TOOL_META_KEYS,
            &extra,
        ) {
            return Some((None, u));
        }
        let props = self.schema.get("properties").and_then(Value::as_object)?;
        super::meta::first_unknown(
            props.keys().map(String::as_str),
            super::meta::CALL_META_KEYS,
            &[],
        )
        .map(|u| (Some("properties"), u))
    }

    /// Parses a tool from JSON with a typed error; a meta key dagloop does not define is
    /// refused (`protocol.unknown_meta_key`, see [`Tool::unknown_meta_key`]).
    pub fn from_value(v: Value) -> Result<Tool, ProtocolError> {
        if !v.is_object() {
            return Err(ProtocolError::NotAnObject {
                what: "tool",
                found: json_type(&v),
            });
        }
        if v.get("_tool")
            .and_then(Value::as_str)
            .is_none_or(|s| s.trim().is_empty())
        {
            return Err(ProtocolError::MissingField {
                what: "tool",
                field: "_tool",
            });
        }
        let tool: Tool = serde_json::from_value(v).map_err(|e| ProtocolError::Malformed {
            what: "tool",
            reason: e.to_string(),
        })?;
        match tool.unknown_meta_key() {
            None => Ok(tool),
            Some((at, unknown)) => Err(ProtocolError::UnknownMetaKey {
                what: if at.is_some() {
                    "tool properties"
                } else {
                    "tool"
                },
                unknown,
            }),
        }
    }
}

/// `params` without the `_` meta keys: what a tool's params schema, a rule's `when`, a delegate's
/// input and a recording's key see of a call.
pub fn without_meta(params: &Map<String, Value>) -> Map<String, Value> {
    params
        .iter()
        .filter(|(k, _)| !super::meta::is_meta_key(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `to_value` builds what serialising the call gives, key order included.
    #[test]
    fn to_value_is_the_serialised_call() {
        let mut odd = Call::new("t")
            .param("_tool", "shadow")
            .param("b", json!([1, {"c": null}]));
        odd.output_path = Some("†state.x".into());
        odd.output_method = Some(OutputMethod::Concat);
        odd.instance = Some("i1".into());
        odd.scopes = Some(vec!["state".into(), "input.a".into()]);
        let calls = [
            Call::new("a"),
            Call::try_from(
                json!({"_tool": "b", "z": 1, "a": {"y": [2]}, "_outputPath": "†state.q",
                "_outputMethod": "merge"}),
            )
            .expect("call"),
            odd,
        ];
        for call in calls {
            let built = call.to_value();
            let serialised = serde_json::to_value(&call).expect("serialises");
            assert_eq!(built, serialised);
            assert_eq!(built.to_string(), serialised.to_string(), "same key order");
        }
    }
}
