//! The wire vocabulary of dagloop: messages, tools, calls, solutions, references and ids.
//!
//! Plain serde types and pure parsing only. This module imports nothing else from the crate,
//! performs no IO and makes no decisions; every other module builds on it.

mod call;
mod event;
mod limits;
pub mod mcp_server;
mod message;
pub mod meta;
mod op;
mod params;
mod path_text;
mod plan_item;
pub mod reference;

pub(crate) use call::SplitCall;
pub use call::{
    Call, KINDS, OutputMethod, Tool, ToolApproval, collect_refs, env_placeholders, json_type,
    kind_of, without_meta,
};
pub use event::{Decision, Event, EventKind, FailKind, LaunchedParams, LaunchedTool};
pub use limits::Limits;
pub use mcp_server::{HttpServer, McpConfigError, McpServerConfig, NamedServer, StdioServer};
pub use message::{Message, Role, Solution};
pub use meta::{CALL_META_KEYS, TOOL_META_KEYS, UnknownMetaKey, is_meta_key};
pub use op::{Actor, Op, OpError, StandingCall, StandingSpec, canonical, params_hash};
pub use params::Params;
pub use path_text::PathText;
pub use plan_item::PlanItem;
pub use reference::{
    ASCII_MARKER, Combinator, Expression, MARKER, Path, Reference, ReferenceError, Segment,
    looks_like_reference, parse_expression,
};

use serde::{Deserialize, Serialize};

/// Identifies one call within a run (unique across the run's steps).
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CallId(pub u64);

impl std::fmt::Display for CallId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "c{}", self.0)
    }
}

/// The one shape of an error object: the value a failed, refused, rejected or unresolved call
/// leaves in state and in its events, and what the model is shown about it:
/// `{"code": "<stable code>", "message": "<words>", "details": <anything, when there is more>}`.
/// Every error object dagloop builds (activities, hooks, delegates, the scheduler) comes from
/// here.
pub fn error_object(
    code: &str,
    message: impl Into<String>,
    details: Option<serde_json::Value>,
) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    m.insert("code".into(), serde_json::Value::String(code.to_string()));
    m.insert("message".into(), serde_json::Value::String(message.into()));
    if let Some(d) = details.filter(|d| !d.is_null()) {
        m.insert("details".into(), d);
    }
    serde_json::Value::Object(m)
}

/// Milliseconds since the Unix epoch, supplied by the caller (the core never reads a clock).
pub type Millis = u64;

/// A message, call, tool or solution that does not have the expected shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// Something that must be a JSON object is not.
    #[error("{what} must be a JSON object, found {found}")]
    NotAnObject {
        /// What was being read (`call`, `tool`, `solution`).
        what: &'static str,
        /// The JSON type found instead.
        found: &'static str,
    },
    /// A required field is absent.
    #[error("{what} is missing the required field `{field}`")]
    MissingField {
        /// What was being read.
        what: &'static str,
        /// The missing field.
        field: &'static str,
    },
    /// A field has the wrong type or value.
    #[error("{what} field `{field}` is invalid: {reason}")]
    InvalidField {
        /// What was being read.
        what: &'static str,
        /// The offending field.
        field: &'static str,
        /// Why it is invalid.
        reason: String,
    },
    /// `_outputMethod` names no known method.
    #[error(
        "call to `{tool}` has unknown _outputMethod `{method}` (expected one of set, merge, assign, push, concat)"
    )]
    UnknownOutputMethod {
        /// The tool of the offending call.
        tool: String,
        /// The method as written.
        method: String,
    },
    /// A `_`-prefixed key that dagloop does not define (a typo fails closed).
    #[error("{what}: {unknown}")]
    UnknownMetaKey {
        /// What was being read.
        what: &'static str,
        /// The key and the closest defined one.
        unknown: UnknownMetaKey,
    },
    /// The value could not be read for another reason.
    #[error("malformed {what}: {reason}")]
    Malformed {
        /// What was being read.
        what: &'static str,
        /// The deserializer's explanation.
        reason: String,
    },
}

crate::codes::has_code!(ProtocolError);

impl ProtocolError {
    /// A stable code for programs that react to failures.
    pub fn code(&self) -> &'static str {
        match self {
            ProtocolError::NotAnObject { .. } => "protocol.not_an_object",
            ProtocolError::MissingField { .. } => "protocol.missing_field",
            ProtocolError::InvalidField { .. } => "protocol.invalid_field",
            ProtocolError::UnknownOutputMethod { .. } => "protocol.unknown_output_method",
            ProtocolError::UnknownMetaKey { .. } => "protocol.unknown_meta_key",
            ProtocolError::Malformed { .. } => "protocol.malformed",
        }
    }
}
