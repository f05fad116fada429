//! JSON Schema work: the schema sent to the model, and the checks made on what comes back.
//!
//! [`compose`] builds the schema of one Request from the tools and the user's output schema
//! (`{"thoughts"?, "calls": [...], "output": <user schema> | null}`). [`OutputValidator`] checks a
//! final output against the user's schema, [`ParamsValidator`] / [`ToolValidators`] check a call's
//! params (after reference resolution) against its tool. Every schema is compiled once, offline
//! (no `$ref` is ever fetched from the network or the file system), and every validation returns
//! *all* violations, each with the JSON pointer of the offending value, in a stable order.
//!
//! [`published`] gives access to the JSON Schemas of dagloop's own files (goal, solution, call,
//! tool, scripted model) shipped in `schemas/`.
//!
//! Deliberately not here: resolving references inside params (that is `state`), deciding what
//! to do with violations (retries are the engine's business), or talking to any model.
//! The rules are written down in `spec/schema.md`.

mod compose;
pub mod published;
mod refs;
mod validate;

pub use compose::{REFERENCE_PATTERN, compose, is_meta_key, reference_string_schema};
pub use validate::{OutputValidator, ParamsValidator, ToolValidators, validate_params};

use serde::{Deserialize, Serialize};

/// Which schema an error is about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", content = "name", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Subject {
    /// The user's output schema.
    OutputSchema,
    /// The params schema of a tool (the tool schema without its `_` meta keys).
    ToolParams(String),
    /// The `_output` schema of a tool.
    ToolOutput(String),
    /// The composed Request schema as a whole.
    Composed,
    /// One of the schemas published in `schemas/` (its file name).
    Published(String),
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Subject::OutputSchema => write!(f, "the output schema"),
            Subject::ToolParams(t) => write!(f, "the params schema of tool `{t}`"),
            Subject::ToolOutput(t) => write!(f, "the `_output` schema of tool `{t}`"),
            Subject::Composed => write!(f, "the composed request schema"),
            Subject::Published(n) => write!(f, "the published schema `{n}`"),
        }
    }
}

/// Composing or compiling a schema failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// A schema is not a valid JSON Schema (draft 2020-12 unless it names another draft), or one
    /// of its `$ref`s points at nothing.
    #[error("{subject} is not a valid JSON Schema ({}): {message}", at(.pointer))]
    InvalidSchema {
        /// Which schema.
        subject: Subject,
        /// JSON pointer inside that schema (empty for the root).
        pointer: String,
        /// What is wrong.
        message: String,
    },
    /// A tool's name cannot be used.
    #[error("invalid tool name {name:?}: {reason}")]
    InvalidToolName {
        /// The name as given.
        name: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A tool's params schema does not describe an object (a Call is always an object).
    #[error("tool `{tool}` must describe an object (its schema has \"type\": {found})")]
    ToolNotObject {
        /// The tool.
        tool: String,
        /// The `type` it declares instead, as JSON.
        found: String,
    },
    /// A meta key of a tool (`_outputPath`, ...) has an unusable value.
    #[error("tool `{tool}` has an invalid `{field}`: {reason}")]
    InvalidToolMeta {
        /// The tool.
        tool: String,
        /// The meta key.
        field: &'static str,
        /// Why it is unusable.
        reason: String,
    },
    /// A call names a tool that is not defined.
    #[error("unknown tool `{tool}`")]
    ToolNotFound {
        /// The name the call used.
        tool: String,
    },
}

/// `at /a/b`, or `at the root` for the empty pointer.
fn at(pointer: &str) -> String {
    match pointer {
        "" => "at the root".to_string(),
        p => format!("at {p}"),
    }
}

crate::codes::has_code!(SchemaError);

impl SchemaError {
    /// A stable code for programs that react to failures.
    pub fn code(&self) -> &'static str {
        match self {
            SchemaError::InvalidSchema { .. } => "schema.invalid_schema",
            SchemaError::InvalidToolName { .. } => "schema.invalid_tool_name",
            SchemaError::ToolNotObject { .. } => "schema.tool_not_object",
            SchemaError::InvalidToolMeta { .. } => "schema.invalid_tool_meta",
            SchemaError::ToolNotFound { .. } => "schema.tool_not_found",
        }
    }
}

/// One reason a value does not match a schema.
///
/// Ordered by `pointer`, then `schema_pointer`, `keyword` and `message`, which is the order
/// validations return them in.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Violation {
    /// JSON pointer of the offending value inside the validated instance (empty for the root).
    pub pointer: String,
    /// JSON pointer of the failing keyword inside the schema.
    pub schema_pointer: String,
    /// The failing keyword (`type`, `required`, `anyOf`, ...).
    pub keyword: String,
    /// A human-readable explanation, capped at [`MAX_MESSAGE_CHARS`] characters.
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", at(&self.pointer), self.message)
    }
}

/// Longest violation message kept; longer ones (typically echoing a big value) are cut.
pub const MAX_MESSAGE_CHARS: usize = 400;

/// Cuts `s` to at most [`MAX_MESSAGE_CHARS`] characters, marking the cut.
pub(crate) fn cap_message(s: String) -> String {
    if s.chars().count() <= MAX_MESSAGE_CHARS {
        return s;
    }
    let mut out: String = s.chars().take(MAX_MESSAGE_CHARS).collect();
    out.push_str("… (truncated)");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_message_cuts_on_character_boundaries() {
        let short = "é".repeat(MAX_MESSAGE_CHARS);
        assert_eq!(cap_message(short.clone()), short);
        let long = "é".repeat(MAX_MESSAGE_CHARS + 1);
        let capped = cap_message(long);
        assert!(capped.starts_with(&"é".repeat(MAX_MESSAGE_CHARS)));
        assert!(capped.ends_with("… (truncated)"));
    }

    #[test]
    fn codes_are_stable() {
        let e = SchemaError::ToolNotObject {
            tool: "t".into(),
            found: "\"string\"".into(),
        };
        assert_eq!(e.code(), "schema.tool_not_object");
        let e = SchemaError::InvalidToolMeta {
            tool: "t".into(),
            field: "_outputPath",
            reason: "x".into(),
        };
        assert_eq!(e.code(), "schema.invalid_tool_meta");
    }

    /// A params object is checked in place when it holds no meta keys, and without them when it
    /// does: both ways give exactly what checking a copy without meta keys gives.
    #[test]
    fn params_are_checked_in_place_or_without_their_meta_keys() {
        let tool =
            crate::protocol::Tool::from_value(serde_json::json!({"_tool": "t", "type": "object",
            "properties": {"n": {"type": "integer"}}, "required": ["n"],
            "additionalProperties": false}))
            .expect("tool");
        let v = ParamsValidator::new(&tool).expect("compiles");
        let cases = [
            serde_json::json!({"n": 1}),
            serde_json::json!({"n": "x"}),
            serde_json::json!({"n": 1, "_output": {"a": 1}}),
            serde_json::json!({"m": 1, "_output": 2}),
        ];
        let text = |found: Vec<Violation>| -> Vec<String> {
            found.iter().map(ToString::to_string).collect()
        };
        for case in cases {
            let serde_json::Value::Object(map) = &case else {
                panic!("an object");
            };
            // What checking a copy without the meta keys gives (the behaviour kept).
            let stripped = serde_json::Value::Object(crate::protocol::without_meta(map));
            let expected = text(v.validate_value(&stripped));
            let params = crate::protocol::Params::from(map.clone());
            assert_eq!(text(v.validate(&params)), expected, "{case}");
            assert_eq!(text(v.validate_value(&case)), expected, "{case}");
        }
        assert!(
            v.validate_value(&serde_json::json!({"n": 1, "_output": 2}))
                .is_empty()
        );
        assert_eq!(v.validate_value(&serde_json::json!({"n": "x"})).len(), 1);
        assert_eq!(
            v.validate_value(&serde_json::json!([1])).len(),
            1,
            "not an object"
        );
    }

    #[test]
    fn params_as_written_defer_those_that_hold_references() {
        let tool: crate::protocol::Tool = serde_json::from_value(serde_json::json!({
            "_tool": "t", "type": "object",
            "properties": {"n": {"type": "integer"}, "note": {"type": "string"},
                "items": {"type": "array", "items": {"type": "integer"}}},
            "required": ["n", "note"], "additionalProperties": false
        }))
        .expect("tool");
        let v = ParamsValidator::new(&tool).expect("validator");
        let obj = |v: serde_json::Value| {
            crate::protocol::Params::from(v.as_object().cloned().unwrap_or_default())
        };
        // A reference stands in for a required integer, another sits inside an array: both
        // params wait to be resolved; read as resolved values they would be wrong.
        let written = obj(serde_json::json!({"n": "†state.n", "items": [1, "†state.k"],
            "note": "x", "_outputPath": "†state.out"}));
        assert_eq!(v.validate_written(&written).expect("checked"), vec![]);
        assert!(!v.validate(&written).is_empty());
        // The literal params are still checked, and a required one left out is still missing.
        let bad = obj(serde_json::json!({"n": "†state.n", "note": 5, "extra": true}));
        let found: Vec<(String, String)> = v
            .validate_written(&bad)
            .expect("checked")
            .into_iter()
            .map(|x| (x.pointer, x.keyword))
            .collect();
        assert!(found.contains(&("/note".into(), "type".into())), "{found:?}");
        assert!(found.contains(&(String::new(), "additionalProperties".into())), "{found:?}");
        let missing = obj(serde_json::json!({"n": "†state.n"}));
        let found = v.validate_written(&missing).expect("checked");
        assert!(found.iter().any(|x| x.keyword == "required"), "{found:?}");
    }
}
