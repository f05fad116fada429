//! Why an agent could not be built: what the builder and the loading of a run's agent tree
//! (delegate goals, models, activities) report, each with a stable code.
//!
//! Deliberately not here: how either works (`builder`, `loading`). Both use this enum; neither
//! imports the other for it.

use crate::llm::LlmError;
use crate::machine::ConfigError;

/// The agent could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// Neither the goal nor the caller named a model.
    #[error(
        "no model: give one with --model or the goal's `model` field (scripted:PATH, openai:MODEL, anthropic:MODEL)"
    )]
    NoModel,
    /// The model spec is unknown or the model cannot be set up.
    #[error(transparent)]
    Model(#[from] LlmError),
    /// A schema of the goal cannot be compiled, or a limit is out of range.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A tool names a Rust activity nobody registered.
    #[error("tool `{tool}` needs activity `{activity}`: {reason}")]
    MissingActivity {
        /// The tool.
        tool: String,
        /// Its `_activity`.
        activity: String,
        /// What is missing.
        reason: String,
    },
    /// A tool's activity cannot run: an unknown kind (`activity.unknown_kind`) or a configuration
    /// its kind refuses (`_http` without `url`, unknown keys...: `activity.config`).
    #[error(transparent)]
    Activity(crate::tools::ActivityError),
    /// A delegate tool's goal cannot be read.
    #[error("delegate tool `{tool}`: {reason}")]
    Delegate {
        /// The tool.
        tool: String,
        /// Why.
        reason: String,
    },
    /// The policy asks a reviewer but none was given.
    #[error(
        "the approval policy asks a reviewer, but no approver is configured (give one, or call external_review() and answer through RunHandle::submit)"
    )]
    NoApprover,
}

crate::codes::has_code!(AgentError);

impl AgentError {
    /// A stable code for programs that react to failures.
    pub fn code(&self) -> &'static str {
        match self {
            AgentError::NoModel => "agent.no_model",
            AgentError::Model(e) => e.code(),
            AgentError::Config(e) => e.code(),
            AgentError::MissingActivity { .. } => "agent.missing_activity",
            AgentError::Delegate { .. } => "agent.delegate",
            AgentError::Activity(e) => e.code(),
            AgentError::NoApprover => "agent.no_approver",
        }
    }
}
