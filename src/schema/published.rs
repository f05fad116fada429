//! The JSON Schemas of dagloop's own documents, shipped in `schemas/` and compiled into the crate.
//!
//! Deliberately not here: reading goal files or scripts from disk, or turning a valid document
//! into typed values (the goal loader and the scripted model do that).

use serde_json::Value;

use super::validate::OutputValidator;
use super::{SchemaError, Subject, Violation};

/// A document type with a published schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Document {
    /// A goal file (`schemas/goal.schema.json`).
    Goal,
    /// A Solution (`schemas/solution.schema.json`).
    Solution,
    /// A Call (`schemas/call.schema.json`).
    Call,
    /// A Tool (`schemas/tool.schema.json`).
    Tool,
    /// A scripted-model file (`schemas/scripted-model.schema.json`).
    ScriptedModel,
    /// The operator's configuration (`schemas/config.schema.json`).
    Config,
    /// A `dagloop test` case (`schemas/test-case.schema.json`).
    TestCase,
}

impl Document {
    /// Every document type.
    pub const ALL: [Document; 7] = [
        Document::Goal,
        Document::Solution,
        Document::Call,
        Document::Tool,
        Document::ScriptedModel,
        Document::Config,
        Document::TestCase,
    ];

    /// The schema's file name under `schemas/`.
    pub fn file_name(self) -> &'static str {
        match self {
            Document::Goal => "goal.schema.json",
            Document::Solution => "solution.schema.json",
            Document::Call => "call.schema.json",
            Document::Tool => "tool.schema.json",
            Document::ScriptedModel => "scripted-model.schema.json",
            Document::Config => "config.schema.json",
            Document::TestCase => "test-case.schema.json",
        }
    }

    /// The schema's text, as shipped.
    pub fn text(self) -> &'static str {
        match self {
            Document::Goal => include_str!("../../schemas/goal.schema.json"),
            Document::Solution => include_str!("../../schemas/solution.schema.json"),
            Document::Call => include_str!("../../schemas/call.schema.json"),
            Document::Tool => include_str!("../../schemas/tool.schema.json"),
            Document::ScriptedModel => include_str!("../../schemas/scripted-model.schema.json"),
            Document::Config => include_str!("../../schemas/config.schema.json"),
            Document::TestCase => include_str!("../../schemas/test-case.schema.json"),
        }
    }

    /// The schema as JSON.
    pub fn schema(self) -> Result<Value, SchemaError> {
        serde_json::from_str(self.text()).map_err(|e| SchemaError::InvalidSchema {
            subject: self.subject(),
            pointer: String::new(),
            message: format!("not JSON: {e}"),
        })
    }

    /// The schema, compiled.
    pub fn validator(self) -> Result<OutputValidator, SchemaError> {
        OutputValidator::with_subject(&self.schema()?, self.subject())
    }

    /// Checks `doc` against the schema (compiled once per process, on first use).
    pub fn validate(self, doc: &Value) -> Result<Vec<Violation>, SchemaError> {
        static COMPILED: [std::sync::OnceLock<Result<OutputValidator, SchemaError>>; 7] =
            [const { std::sync::OnceLock::new() }; 7];
        let slot = Document::ALL.iter().position(|d| *d == self).unwrap_or(0);
        match COMPILED[slot].get_or_init(|| self.validator()) {
            Ok(v) => Ok(v.validate(doc)),
            Err(e) => Err(e.clone()),
        }
    }

    fn subject(self) -> Subject {
        Subject::Published(self.file_name().to_string())
    }
}
