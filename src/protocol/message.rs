//! Context messages and the model's Solution.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{Call, ProtocolError, json_type};

/// Who a text message is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Role {
    /// Instructions from the program.
    System,
    /// The user or the program on the user's behalf.
    User,
    /// The model.
    Assistant,
}

/// One entry of the context sent to the model (protocol chapters 001, 005, 006, 009, 012).
///
/// Unknown fields are kept in `extra` so a message read and written again is unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
#[non_exhaustive]
pub enum Message {
    /// Plain text.
    Text {
        /// Who says it.
        role: Role,
        /// The text.
        text: String,
        /// Unknown fields.
        #[serde(flatten)]
        extra: Map<String, Value>,
    },
    /// Structured data of some kind (`user`, `report`, ...).
    Data {
        /// The kind, which references use as their first segment.
        kind: String,
        /// The value.
        data: Value,
        /// Optional JSON Schema describing `data`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        schema: Option<Value>,
        /// Instance name (protocol chapter 013).
        #[serde(rename = "_instance", default, skip_serializing_if = "Option::is_none")]
        instance: Option<String>,
        /// Unknown fields.
        #[serde(flatten)]
        extra: Map<String, Value>,
    },
    /// The run's input (`†input.*`).
    Input {
        /// The input value.
        data: Value,
        /// Optional JSON Schema of the input.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        schema: Option<Value>,
        /// Unknown fields.
        #[serde(flatten)]
        extra: Map<String, Value>,
    },
    /// The run's shared state (`†state.*`).
    State {
        /// The current (merged) state.
        data: Value,
        /// Optional JSON Schema of the state.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        schema: Option<Value>,
        /// Unknown fields.
        #[serde(flatten)]
        extra: Map<String, Value>,
    },
    /// The previous plan: calls with their status (protocol chapter 012).
    Plan {
        /// The calls, each with a `_status` field.
        plan: Vec<super::PlanItem>,
        /// Unknown fields.
        #[serde(flatten)]
        extra: Map<String, Value>,
    },
    /// A tool made available to the model.
    Tool {
        /// The tool schema, or its name.
        tool: Value,
        /// Unknown fields.
        #[serde(flatten)]
        extra: Map<String, Value>,
    },
    /// A failed call and why (protocol chapter 010, "the Error Message").
    Error {
        /// The call that failed, as the model wrote it.
        call: Value,
        /// What went wrong.
        error: Value,
        /// Unknown fields.
        #[serde(flatten)]
        extra: Map<String, Value>,
    },
}

/// What the model returns for one Request: calls to make and, when done, the output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Solution {
    /// Calls to run, in the order the model wrote them.
    #[serde(default)]
    pub calls: Vec<Call>,
    /// The final output, or null while the work goes on.
    #[serde(default)]
    pub output: Value,
    /// Free-form metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Value>,
    /// The model's reasoning, if it shares it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thoughts: Option<Value>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Solution {
    /// Reads a Solution with typed errors that name the offending call.
    pub fn from_value(v: Value) -> Result<Solution, ProtocolError> {
        let Value::Object(mut m) = v else {
            return Err(ProtocolError::NotAnObject {
                what: "solution",
                found: json_type(&v),
            });
        };
        let calls = match m.shift_remove("calls") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .into_iter()
                .map(Call::parse)
                .collect::<Result<Vec<_>, _>>()?,
            Some(other) => {
                return Err(ProtocolError::InvalidField {
                    what: "solution",
                    field: "calls",
                    reason: format!("expected an array, found {}", json_type(&other)),
                });
            }
        };
        let output = m.shift_remove("output").unwrap_or(Value::Null);
        let meta = m.shift_remove("meta");
        let thoughts = m.shift_remove("thoughts");
        Ok(Solution {
            calls,
            output,
            meta,
            thoughts,
            extra: m,
        })
    }

    /// True when the model says it is done (`output` is not null).
    pub fn is_final(&self) -> bool {
        !self.output.is_null()
    }
}
