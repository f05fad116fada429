//! The errors of the `llm` module, with stable codes and the retry classification of rule 17.
//!
//! Messages never hold a secret: every text that comes from the network is passed through the
//! provider's redactor before it is stored here.

use std::time::Duration;

/// What went wrong while talking to a model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    /// The server answered with a non-success HTTP status (or a scripted error turn).
    #[error("model server answered HTTP {status}: {message}")]
    HttpStatus {
        /// The status code.
        status: u16,
        /// The server's `Retry-After`, when it sent one.
        retry_after: Option<Duration>,
        /// The error message from the body (redacted, truncated).
        message: String,
    },
    /// The server refused the request because its context does not fit the model's window
    /// (OpenAI's `context_length_exceeded`, llama.cpp's `exceed_context_size_error`,
    /// Anthropic's `prompt is too long`). Neither retried nor fallen back from.
    #[error("the request does not fit the model's context window (HTTP {status}): {message}")]
    ContextOverflow {
        /// The status code (400 or 413).
        status: u16,
        /// The error message from the body (redacted, truncated).
        message: String,
    },
    /// Connecting, sending or reading failed (including a connection dropped mid-stream).
    #[error("transport error talking to the model server: {message}")]
    Transport {
        /// What the HTTP client said (redacted).
        message: String,
    },
    /// The server sent nothing for too long.
    #[error("model server sent nothing for {}s", after.as_secs_f64())]
    IdleTimeout {
        /// The configured idle timeout.
        after: Duration,
    },
    /// The attempt took longer than the request timeout.
    #[error("model request took longer than {}s", after.as_secs_f64())]
    Timeout {
        /// The configured request timeout.
        after: Duration,
    },
    /// The SSE stream is not what the provider should send (invalid UTF-8, a data line that is
    /// not JSON, an unexpected shape).
    #[error("malformed SSE stream: {reason}")]
    BadSse {
        /// What was wrong.
        reason: String,
    },
    /// One SSE line was longer than the framer keeps ([`MAX_SSE_LINE`](crate::llm::MAX_SSE_LINE)
    /// bytes). Not retried: a server that sends one will likely send it again.
    #[error("model stream sent an SSE line longer than {limit} bytes")]
    LineTooLong {
        /// The cap, in bytes.
        limit: usize,
    },
    /// The body ended before the provider's end-of-stream marker.
    #[error("model stream ended early: {reason}")]
    IncompleteStream {
        /// What was missing.
        reason: String,
    },
    /// The provider reported an error inside the stream.
    #[error("model provider error ({kind}): {message}")]
    Provider {
        /// The provider's error type (`overloaded_error`, `server_error`, ...).
        kind: String,
        /// Its message (redacted).
        message: String,
        /// Whether the provider's error type is transient.
        retryable: bool,
    },
    /// A scripted model was asked for more turns than its script has.
    #[error("scripted model has no turn left (the script has {turns} turns)")]
    ScriptExhausted {
        /// Number of turns in the script.
        turns: usize,
    },
    /// A script file could not be read.
    #[error("cannot read script {path}: {reason}")]
    ScriptIo {
        /// The file.
        path: String,
        /// The IO error.
        reason: String,
    },
    /// A script file is not a valid script.
    #[error("invalid script {path}: {reason}")]
    ScriptInvalid {
        /// The file (or `<inline>`).
        path: String,
        /// What is wrong, naming the turn.
        reason: String,
    },
    /// A model spec names no known provider.
    #[error(
        "unknown model spec `{spec}` (expected scripted:PATH, openai:MODEL or anthropic:MODEL)"
    )]
    UnknownSpec {
        /// The spec as written.
        spec: String,
    },
    /// A model spec names a provider but is incomplete.
    #[error("invalid model spec `{spec}`: {reason}")]
    InvalidSpec {
        /// The spec as written.
        spec: String,
        /// What is wrong.
        reason: String,
    },
    /// A required API key variable is unset (for OpenAI: no key and no `OPENAI_BASE_URL`).
    #[error("environment variable {var} is not set{}", missing_key_hint(var))]
    MissingApiKey {
        /// The variable name.
        var: &'static str,
    },
    /// A provider could not be configured (bad base URL, unusable key characters).
    #[error("invalid model configuration: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// A native tool call's arguments do not make a Call.
    #[error("tool call `{name}` is invalid: {reason}")]
    BadToolCall {
        /// The tool name.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

/// What to do about a missing key, by variable.
fn missing_key_hint(var: &str) -> &'static str {
    match var {
        "OPENAI_API_KEY" => {
            ": the hosted OpenAI API needs a key; a local OpenAI-compatible server (llama.cpp, \
             vLLM, Ollama) needs none, but then set OPENAI_BASE_URL to it"
        }
        "ANTHROPIC_API_KEY" => ": the Anthropic API needs a key",
        _ => "",
    }
}

crate::codes::has_code!(LlmError);

impl LlmError {
    /// A stable code for programs that react to failures.
    pub fn code(&self) -> &'static str {
        match self {
            LlmError::HttpStatus { .. } => "llm.http_status",
            LlmError::ContextOverflow { .. } => "llm.context_overflow",
            LlmError::Transport { .. } => "llm.transport",
            LlmError::IdleTimeout { .. } => "llm.idle_timeout",
            LlmError::Timeout { .. } => "llm.timeout",
            LlmError::BadSse { .. } => "llm.bad_sse",
            LlmError::LineTooLong { .. } => "llm.line_too_long",
            LlmError::IncompleteStream { .. } => "llm.incomplete_stream",
            LlmError::Provider { .. } => "llm.provider_error",
            LlmError::ScriptExhausted { .. } => "llm.script_exhausted",
            LlmError::ScriptIo { .. } => "llm.script_io",
            LlmError::ScriptInvalid { .. } => "llm.script_invalid",
            LlmError::UnknownSpec { .. } => "llm.unknown_spec",
            LlmError::InvalidSpec { .. } => "llm.invalid_spec",
            LlmError::MissingApiKey { .. } => "llm.missing_api_key",
            LlmError::InvalidConfig { .. } => "llm.invalid_config",
            LlmError::BadToolCall { .. } => "llm.bad_tool_call",
        }
    }

    /// Whether a failed attempt with this error may be retried (before any content was
    /// delivered): transport failures, timeouts, broken or malformed streams, transient provider
    /// errors, and HTTP 408, 409, 429 and 5xx. Never other 4xx, configuration or script errors.
    pub fn is_retryable(&self) -> bool {
        match self {
            LlmError::HttpStatus { status, .. } => {
                matches!(status, 408 | 409 | 429) || (500..=599).contains(status)
            }
            LlmError::Transport { .. }
            | LlmError::IdleTimeout { .. }
            | LlmError::Timeout { .. }
            | LlmError::BadSse { .. }
            | LlmError::IncompleteStream { .. } => true,
            LlmError::Provider { retryable, .. } => *retryable,
            _ => false,
        }
    }

    /// Whether another model could answer where this one failed after its retries (fallback
    /// models): transport failures, timeouts, broken or malformed streams, transient provider
    /// errors (overloaded) and HTTP 408, 409, 429 and 5xx: the retryable errors. Never an error
    /// of the request itself (400, 422, a schema refusal), of the configuration (401, 403, a
    /// missing key) or of a script.
    pub fn falls_back(&self) -> bool {
        self.is_retryable()
    }

    /// The delay the server asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            LlmError::HttpStatus { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}
